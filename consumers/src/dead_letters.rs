//! Operating on dead letters: replay and discard, idempotent and tenant-scoped.

use std::sync::Arc;

use jobs_core::{
    Clock, DeadLetterFilter, DeadLetterId, DeadLetterStatus, DeadLetterStore, Envelope,
    EnvelopeError, PublishOptions, QueueError, QueuePort, StoreError, SystemClock, TenantId,
    Transition,
};
use thiserror::Error;

/// Replays and discards dead letters.
///
/// Both act only on letters in `pending_review`, and both are idempotent: repeating a command
/// (say, a bulk replay re-run after an interruption) neither skips nor doubles anything.
/// Each change is recorded in the letter's history as made by whoever
/// [`acting_as`](Self::acting_as) names (`jobs` unless set).
#[derive(Clone)]
pub struct DeadLetters {
    store: Arc<dyn DeadLetterStore>,
    queue: Arc<dyn QueuePort>,
    clock: Arc<dyn Clock>,
    /// Who asked, recorded with every transition.
    by: String,
}

/// Who a [`DeadLetters`] records as the author of its changes unless told otherwise.
const DEFAULT_BY: &str = "jobs";

/// What a replay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    /// Published again and marked `replayed`.
    Done,
    /// It was replayed before; published again (harmless: deduplicated, or skipped by the
    /// job's claim).
    AlreadyDone,
}

/// A replay that could not be done.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// No such dead letter, or not the given tenant's.
    #[error("dead letter {0} not found")]
    NotFound(DeadLetterId),
    /// Discarded letters stay discarded.
    #[error("dead letter {id} is {status}; only pending_review letters can be replayed")]
    Conflict {
        /// The letter.
        id: DeadLetterId,
        /// Its status.
        status: DeadLetterStatus,
    },
    /// Poison cannot be replayed as it is: it would only be dead-lettered again.
    #[error(
        "dead letter {id} holds no valid envelope, so it cannot be replayed ({source}); discard it"
    )]
    NotAnEnvelope {
        /// The letter.
        id: DeadLetterId,
        /// What is wrong with the payload.
        source: EnvelopeError,
    },
    /// Publishing failed after the letter was marked replayed: run the replay again.
    #[error(
        "publishing dead letter {id} failed ({source}); it is marked replayed: replay it again to publish"
    )]
    Publish {
        /// The letter.
        id: DeadLetterId,
        /// The transport's error.
        source: QueueError,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl DeadLetters {
    /// Operates on `store`, replaying through `queue`.
    pub fn new(store: Arc<dyn DeadLetterStore>, queue: Arc<dyn QueuePort>) -> Self {
        DeadLetters {
            store,
            queue,
            clock: Arc::new(SystemClock),
            by: DEFAULT_BY.to_owned(),
        }
    }

    /// Takes time from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// A copy that records `by` (free text, such as `jobsctl (alice)` or
    /// `console (operator)`) as the author of its replays and discards in each letter's
    /// history, so an operator can tell later who changed a letter and from where. Sharing the
    /// store, queue and clock, it is cheap enough to make per request.
    pub fn acting_as(&self, by: impl Into<String>) -> DeadLetters {
        DeadLetters {
            by: by.into(),
            ..self.clone()
        }
    }

    /// Marks the letter `replayed`, which releases the job's claim in `processed_jobs`, then
    /// publishes the original envelope (same job id, same correlation id) to its queue. With
    /// `tenant`, only that tenant's letter.
    ///
    /// Repeating a replay publishes again, under the same dedup key `dead-letter-{id}`: a replay
    /// interrupted between the mark and the publish is finished by running it again, and one
    /// that had finished is dropped by the transport's deduplication or, past its window, by
    /// the job's claim. A bulk replay can therefore always be re-run.
    pub async fn replay(
        &self,
        id: DeadLetterId,
        tenant: Option<TenantId>,
    ) -> Result<Replayed, ReplayError> {
        let letter = match self.store.get(id).await? {
            Some(letter) if tenant.is_none_or(|t| letter.letter.tenant_id == Some(t)) => letter,
            _ => return Err(ReplayError::NotFound(id)),
        };
        if let DeadLetterStatus::Discarded = letter.status {
            return Err(ReplayError::Conflict {
                id,
                status: letter.status,
            });
        }
        let envelope = Envelope::decode(&letter.letter.payload)
            .map_err(|source| ReplayError::NotAnEnvelope { id, source })?;
        let outcome = match self
            .store
            .transition(
                id,
                jobs_core::Resolution::Replay,
                tenant,
                self.clock.now(),
                &self.by,
            )
            .await?
        {
            Transition::Done => Replayed::Done,
            Transition::AlreadyDone => Replayed::AlreadyDone,
            Transition::Conflict(status) => return Err(ReplayError::Conflict { id, status }),
            Transition::NotFound => return Err(ReplayError::NotFound(id)),
        };
        let opts = PublishOptions::default().dedup_key(format!("dead-letter-{id}"));
        self.queue
            .publish(&letter.letter.queue, &envelope, opts)
            .await
            .map_err(|source| ReplayError::Publish { id, source })?;
        Ok(outcome)
    }

    /// The ids of every letter matching `filter` now, in its order, read page by page
    /// (`filter.limit` a page, from its cursors on).
    ///
    /// A bulk action works through such a snapshot rather than re-querying by status: a
    /// letter it has marked `replayed` but not yet published no longer matches
    /// `pending_review`, and would be skipped by a re-run that queried again.
    pub async fn matching(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetterId>, StoreError> {
        let mut page = filter.clone();
        page.limit = page.limit.max(1);
        let mut ids = Vec::new();
        loop {
            let letters = self.store.list(&page).await?;
            ids.extend(letters.iter().map(|l| l.id));
            match letters.last() {
                // The next page is past the last letter, in whichever order they come.
                Some(last) if letters.len() == page.limit as usize && page.newest_first => {
                    page.before = Some(last.id);
                }
                Some(last) if letters.len() == page.limit as usize => page.after = Some(last.id),
                _ => return Ok(ids),
            }
        }
    }

    /// Marks the letter `discarded`. With `tenant`, only that tenant's letter.
    pub async fn discard(
        &self,
        id: DeadLetterId,
        tenant: Option<TenantId>,
    ) -> Result<Transition, StoreError> {
        self.store
            .transition(
                id,
                jobs_core::Resolution::Discard,
                tenant,
                self.clock.now(),
                &self.by,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use jobs_adapter_memory::{MemoryQueue, MemoryStore};
    use jobs_core::{
        CorrelationId, DeadLetterEvent, DeadLetterFilter, DeadLetterStatus, DeadLetterStore,
        Envelope, ManualClock, NewDeadLetter, QueueName, TenantId, Transition,
    };

    use super::{DeadLetters, Replayed};

    fn letter(n: u32, payload: Vec<u8>) -> NewDeadLetter {
        NewDeadLetter {
            job_id: None,
            queue: "billing.invoices".parse().expect("valid"),
            consumer: None,
            tenant_id: None,
            kind: None,
            correlation_id: None,
            payload,
            attempts: 1,
            last_error: format!("letter {n}"),
            reason: None,
            dedup_key: None,
            at: SystemTime::now(),
        }
    }

    #[tokio::test]
    async fn acting_as_is_who_the_store_records() {
        let store = MemoryStore::default();
        let tenant: TenantId = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90"
            .parse()
            .expect("valid");
        let envelope = Envelope::new(
            tenant,
            CorrelationId::generate(),
            "billing.invoice_issued".parse().expect("valid"),
            serde_json::json!({}),
        );
        let to_replay = store
            .record(letter(1, envelope.to_json_bytes().expect("encodes")))
            .await
            .expect("record")
            .id();
        let to_discard = store
            .record(letter(2, b"poison".to_vec()))
            .await
            .expect("record")
            .id();
        let at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let ops = DeadLetters::new(Arc::new(store.clone()), Arc::new(MemoryQueue::default()))
            .with_clock(Arc::new(ManualClock::new(at)));
        let alice = ops.acting_as("jobsctl (alice)");
        assert_eq!(
            alice.replay(to_replay, None).await.expect("replays"),
            Replayed::Done
        );
        assert_eq!(
            ops.discard(to_discard, None).await.expect("discards"),
            Transition::Done
        );
        assert_eq!(
            store.history(to_replay).await.expect("reads"),
            [DeadLetterEvent {
                at,
                from: DeadLetterStatus::PendingReview,
                to: DeadLetterStatus::Replayed,
                by: "jobsctl (alice)".to_owned(),
            }],
            "the copy records who it acts as"
        );
        assert_eq!(
            store.history(to_discard).await.expect("reads"),
            [DeadLetterEvent {
                at,
                from: DeadLetterStatus::PendingReview,
                to: DeadLetterStatus::Discarded,
                by: "jobs".to_owned(),
            }],
            "the original keeps the default"
        );
    }

    #[tokio::test]
    async fn matching_pages_through_every_letter_the_filter_selects() {
        let store = MemoryStore::default();
        let queues: [QueueName; 2] = [
            "billing.invoices".parse().expect("valid"),
            "notify.email".parse().expect("valid"),
        ];
        let mut expected = vec![];
        for n in 0..7 {
            let queue = queues[n % 2].clone();
            let id = store
                .record(NewDeadLetter {
                    job_id: None,
                    queue: queue.clone(),
                    consumer: None,
                    tenant_id: None,
                    kind: None,
                    correlation_id: None,
                    payload: vec![],
                    attempts: 1,
                    last_error: format!("letter {n}"),
                    reason: None,
                    dedup_key: Some(format!("key-{n}")),
                    at: SystemTime::now(),
                })
                .await
                .expect("record")
                .id();
            if queue == queues[0] {
                expected.push(id);
            }
        }
        let ops = DeadLetters::new(Arc::new(store), Arc::new(MemoryQueue::default()));
        let filter = DeadLetterFilter {
            queue: Some(queues[0].clone()),
            limit: 2,
            ..DeadLetterFilter::default()
        };
        assert_eq!(expected.len(), 4);
        assert_eq!(
            ops.matching(&filter).await.expect("lists"),
            expected,
            "every page, in id order, only the filter's queue"
        );
        let newest = DeadLetterFilter {
            newest_first: true,
            ..filter.clone()
        };
        let mut reversed = expected.clone();
        reversed.reverse();
        assert_eq!(
            ops.matching(&newest).await.expect("lists"),
            reversed,
            "every page newest first, each page past the last"
        );
        let after = DeadLetterFilter {
            after: Some(expected[1]),
            ..filter
        };
        assert_eq!(ops.matching(&after).await.expect("lists"), expected[2..]);
    }
}

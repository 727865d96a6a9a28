//! Operating on dead letters: replay and discard, idempotent and tenant-scoped.

use std::sync::Arc;

use jobs_core::{
    Clock, DeadLetterId, DeadLetterStatus, DeadLetterStore, Envelope, EnvelopeError,
    PublishOptions, QueueError, QueuePort, StoreError, SystemClock, TenantId, Transition,
};
use thiserror::Error;

/// Replays and discards dead letters.
///
/// Both act only on letters in `pending_review`, and both are idempotent: repeating a command
/// (say, a bulk replay re-run after an interruption) neither skips nor doubles anything.
#[derive(Clone)]
pub struct DeadLetters {
    store: Arc<dyn DeadLetterStore>,
    queue: Arc<dyn QueuePort>,
    clock: Arc<dyn Clock>,
}

/// What a replay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    /// Published again and marked `replayed`.
    Done,
    /// It was replayed before: nothing done.
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
    /// Publishing failed; the letter is still pending and the replay can be repeated.
    #[error("publishing dead letter {id} failed: {source}")]
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
        }
    }

    /// Takes time from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Publishes the original envelope (same job id, same correlation id) to its queue, then
    /// marks the letter `replayed`. With `tenant`, only that tenant's letter.
    ///
    /// The publish carries the dedup key `dead-letter-{id}`, so a replay repeated after a crash
    /// between publish and mark is dropped by the transport rather than delivered twice.
    pub async fn replay(
        &self,
        id: DeadLetterId,
        tenant: Option<TenantId>,
    ) -> Result<Replayed, ReplayError> {
        let letter = match self.store.get(id).await? {
            Some(letter) if tenant.is_none_or(|t| letter.letter.tenant_id == Some(t)) => letter,
            _ => return Err(ReplayError::NotFound(id)),
        };
        match letter.status {
            DeadLetterStatus::PendingReview => {}
            DeadLetterStatus::Replayed => return Ok(Replayed::AlreadyDone),
            status => return Err(ReplayError::Conflict { id, status }),
        }
        let envelope = Envelope::decode(&letter.letter.payload)
            .map_err(|source| ReplayError::NotAnEnvelope { id, source })?;
        let opts = PublishOptions::default().dedup_key(format!("dead-letter-{id}"));
        self.queue
            .publish(&letter.letter.queue, &envelope, opts)
            .await
            .map_err(|source| ReplayError::Publish { id, source })?;
        match self
            .store
            .transition(id, DeadLetterStatus::Replayed, tenant, self.clock.now())
            .await?
        {
            Transition::Done => Ok(Replayed::Done),
            Transition::AlreadyDone => Ok(Replayed::AlreadyDone),
            Transition::Conflict(status) => Err(ReplayError::Conflict { id, status }),
            Transition::NotFound => Err(ReplayError::NotFound(id)),
        }
    }

    /// Marks the letter `discarded`. With `tenant`, only that tenant's letter.
    pub async fn discard(
        &self,
        id: DeadLetterId,
        tenant: Option<TenantId>,
    ) -> Result<Transition, StoreError> {
        self.store
            .transition(id, DeadLetterStatus::Discarded, tenant, self.clock.now())
            .await
    }
}

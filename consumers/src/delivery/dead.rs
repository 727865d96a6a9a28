//! Dead letters: recorded with the job's claim, so a job is never both committed and
//! pending review; announced (logged, counted, alerted) once, when new.

use jobs_core::{
    Claim, Delivery, JobId, Kind, NewDeadLetter, Recorded, StoreError, WorkStore, WorkTransaction,
};

use super::{Context, Salvage};
use crate::verdict::DeadReason;

impl<S: WorkStore> Context<S> {
    /// The dead letter of `delivery`, as the runtime records it.
    pub(crate) fn letter(
        &self,
        delivery: &Delivery,
        salvage: &Salvage,
        reason: DeadReason,
        error: String,
    ) -> NewDeadLetter {
        NewDeadLetter {
            job_id: salvage.job_id,
            queue: self.queue.clone(),
            consumer: Some(self.consumer.clone()),
            tenant_id: salvage.tenant_id,
            kind: salvage.kind.clone(),
            correlation_id: salvage.correlation_id,
            payload: delivery.payload.clone(),
            attempts: delivery.attempt,
            last_error: error,
            reason: Some(reason),
            dedup_key: salvage
                .job_id
                .map(|id| id.to_string())
                .or_else(|| delivery.message_id.clone()),
            at: self.clock.now(),
        }
    }

    /// Records the dead letter: a valid envelope's in a work transaction that claims its job,
    /// so the letter and the claim commit together (no copy of the job can commit its effect
    /// as well, and a copy that committed first wins: `None`, the job was settled already); a
    /// broken payload's through the dead-letter store (its job id is not trusted to settle
    /// anyone's claim).
    pub(crate) async fn record(
        &self,
        salvage: &Salvage,
        letter: NewDeadLetter,
    ) -> Result<Option<Recorded>, StoreError> {
        match salvage.job_id.filter(|_| salvage.valid) {
            Some(job_id) => self.record_claimed(job_id, letter).await,
            None => self.dead_letters.record(letter).await.map(Some),
        }
    }

    /// Claims the job and records the letter in one work transaction; `None` when the job was
    /// settled already (processed, or dead-lettered by an earlier delivery: then the letter
    /// pending review is the one recorded).
    async fn record_claimed(
        &self,
        job_id: JobId,
        letter: NewDeadLetter,
    ) -> Result<Option<Recorded>, StoreError> {
        let mut tx = self.store.begin().await?;
        match tx.claim(job_id, &self.consumer, self.clock.now()).await {
            Ok(Claim::Claimed) => {}
            settled => {
                // Not claimed here: nothing of this transaction is kept.
                rollback(tx).await;
                return match settled {
                    Ok(Claim::AlreadyProcessed) => Ok(None),
                    Ok(Claim::DeadLettered) => {
                        let key = job_id.to_string();
                        let pending = self.dead_letters.pending(&self.queue, &key).await?;
                        Ok(pending.map(Recorded::Existing))
                    }
                    Ok(other) => Err(StoreError::failed(format!("unknown claim {other:?}"))),
                    Err(e) => Err(e),
                };
            }
        }
        match tx.record_dead_letter(letter).await {
            Ok(recorded) => {
                tx.commit().await?;
                Ok(Some(recorded))
            }
            Err(e) => {
                rollback(tx).await;
                Err(e)
            }
        }
    }

    /// Logs, counts and alerts a dead letter recorded for the first time.
    pub(crate) fn announce_dead(
        &self,
        kind: Option<&Kind>,
        attempt: u32,
        reason: DeadReason,
        error: &str,
    ) {
        tracing::error!(attempt, reason = reason.as_str(), error = %error, "job dead-lettered");
        // A payload's kind labels the counters only when this worker knows it, so that no
        // producer can make up metric series.
        let known = kind.filter(|kind| self.knows(kind));
        let labels = vec![
            metrics::Label::new("queue", self.queue.to_string()),
            metrics::Label::new(
                "kind",
                known.map_or_else(|| "unknown".to_owned(), ToString::to_string),
            ),
        ];
        if reason == DeadReason::Poison {
            metrics::counter!("jobs_poison_total", labels.clone()).increment(1);
        }
        let mut labels = labels;
        labels.push(metrics::Label::new("reason", reason.as_str()));
        metrics::counter!("jobs_dead_lettered_total", labels).increment(1);
        if let Some(alerts) = &self.alerts {
            alerts.dead_lettered(&self.queue, reason, error);
        }
    }
}

/// Rolls `tx` back, logging (not returning) a failure: the transaction is abandoned either way.
pub(crate) async fn rollback<T: WorkTransaction>(tx: T) {
    if let Err(e) = tx.rollback().await {
        tracing::warn!(error = %e, "rollback failed; the transaction is abandoned");
    }
}

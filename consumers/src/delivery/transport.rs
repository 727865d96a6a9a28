//! A verdict applied through the transport: the per-job way to settle a delivery, and the
//! grouped loop's for the deliveries it settles on their own.

use std::time::{Duration, SystemTime};

use jobs_core::{Delivery, QueueError, Recorded, StoreError, WorkStore};

use super::{Context, Counted, Salvage};
use crate::retry::random_unit;
use crate::verdict::{DeadReason, Outcome, Tried, Verdict, verdict};

impl<S: WorkStore> Context<S> {
    /// Decides what becomes of `delivery`, tried as `tried`, and settles it through the
    /// transport. `salvage` holds what the triage read of its envelope (its kind labels the
    /// counters, and its dead letter).
    pub(crate) async fn conclude(
        &self,
        delivery: &Delivery,
        salvage: Salvage,
        tried: Tried,
    ) -> Outcome {
        let now = self.clock.now();
        let verdict = verdict(tried, delivery.attempt, &self.policy, now, random_unit);
        self.apply(delivery, salvage, verdict).await
    }

    /// What the store's failure makes of a job: a give-back after a wait that grows with the
    /// failures in a row, counted in `jobs_store_failures_total{queue, class}`.
    pub(crate) fn store_unavailable(&self, error: &StoreError) -> Tried {
        let class = error.class();
        metrics::counter!(
            "jobs_store_failures_total",
            "queue" => self.queue.to_string(),
            "class" => class.to_string(),
        )
        .increment(1);
        Tried::StoreFailed {
            failures: self.store_failed(),
            class,
            error: error.to_string(),
        }
    }

    /// Settles `delivery` through the transport as `verdict` says. The ack comes only after
    /// the work committed or the dead letter is recorded; whatever fails, the message stays
    /// unacked and comes back.
    pub(crate) async fn apply(
        &self,
        delivery: &Delivery,
        salvage: Salvage,
        verdict: Verdict,
    ) -> Outcome {
        let lease = &delivery.lease;
        match verdict {
            Verdict::Processed => {
                if let Some(kind) = &salvage.kind {
                    self.count(Counted::Processed, kind);
                }
                match self.settle.ack(lease).await {
                    Ok(()) => Outcome::Processed,
                    // Committed: the redelivery will be skipped as a duplicate.
                    Err(e) => unsettled("ack after commit", &e),
                }
            }
            Verdict::Duplicate => {
                if let Some(kind) = &salvage.kind {
                    self.count(Counted::Duplicate, kind);
                }
                match self.settle.ack(lease).await {
                    Ok(()) => Outcome::Duplicate,
                    Err(e) => unsettled("ack of a duplicate", &e),
                }
            }
            Verdict::RetryAt {
                at,
                delay,
                cause,
                error,
            } => {
                will_retry(delivery.attempt, delay, cause, &error);
                match self.settle.retry_at(lease, at).await {
                    Ok(()) => {
                        match (cause, &salvage.kind) {
                            (DeadReason::UnknownKind, _) => self.count_unknown_kind_retried(),
                            (_, Some(kind)) => self.count(Counted::Retried, kind),
                            (_, None) => {}
                        }
                        Outcome::Retrying { at }
                    }
                    Err(e) => unsettled("retry", &e),
                }
            }
            Verdict::DeferUntil(until) => self.defer(delivery, until).await,
            Verdict::GiveBack {
                until,
                wait,
                class,
                error,
            } => {
                if class.is_retryable() {
                    tracing::warn!(error = %error, retry_in = ?wait, "store unavailable; deferring the job");
                } else {
                    tracing::error!(error = %error, retry_in = ?wait, "the store refuses the work (a missing table, a permission?); deferring the job until it is fixed");
                }
                self.defer(delivery, until).await
            }
            Verdict::Unsettled => Outcome::Unsettled {
                error: "the lease was lost while the job ran; it was stopped and rolled back"
                    .to_owned(),
            },
            Verdict::DeadLetter { reason, error } => {
                self.dead_letter(delivery, salvage, reason, error).await
            }
        }
    }

    /// Records the dead letter (with the job's claim), announces it when new, then acks.
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        salvage: Salvage,
        reason: DeadReason,
        error: String,
    ) -> Outcome {
        let letter = self.letter(delivery, &salvage, reason, error.clone());
        let recorded = match self.record(&salvage, letter).await {
            Ok(Some(recorded)) => recorded,
            Ok(None) => {
                // A copy settled the job first.
                return match self.settle.ack(&delivery.lease).await {
                    Ok(()) => Outcome::Duplicate,
                    Err(e) => unsettled("ack of a duplicate", &e),
                };
            }
            Err(e) => {
                tracing::error!(error = %e, "could not record the dead letter; leaving the message unacked");
                return Outcome::Unsettled {
                    error: format!("recording the dead letter failed: {e}"),
                };
            }
        };
        if let Recorded::New(_) = recorded {
            self.announce_dead(salvage.kind.as_ref(), delivery.attempt, reason, &error);
        }
        match self.settle.ack(&delivery.lease).await {
            Ok(()) => Outcome::DeadLettered {
                id: recorded.id(),
                reason,
            },
            Err(e) => unsettled("ack after dead-lettering", &e),
        }
    }

    async fn defer(&self, delivery: &Delivery, until: SystemTime) -> Outcome {
        match self.settle.defer(&delivery.lease, until).await {
            Ok(()) => Outcome::Deferred { until },
            Err(e) => unsettled("defer", &e),
        }
    }

    /// Gives back deliveries fetched but never started, due now and with their attempt
    /// unspent; one that cannot be given back comes back when its lease expires. Says how
    /// many were given back.
    pub(crate) async fn give_back(&self, deliveries: impl IntoIterator<Item = Delivery>) -> usize {
        let now = self.clock.now();
        let mut given_back = 0;
        for delivery in deliveries {
            match self.settle.defer(&delivery.lease, now).await {
                Ok(()) => given_back += 1,
                Err(e) => {
                    tracing::warn!(queue = %self.queue, error = %e, "could not give back a fetched job; it returns after its lease");
                }
            }
        }
        given_back
    }
}

/// Logs a retry decided for a job at `attempt`, in the job's span.
pub(crate) fn will_retry(attempt: u32, delay: Duration, cause: DeadReason, error: &str) {
    tracing::warn!(attempt, error = %error, retry_in = ?delay, reason = cause.as_str(), "job not done; will retry");
}

/// A settlement the transport refused: logged, and the outcome that says so.
fn unsettled(what: &str, error: &QueueError) -> Outcome {
    tracing::warn!(error = %error, "{what} failed; the lease will expire and the message return");
    Outcome::Unsettled {
        error: format!("{what} failed: {error}"),
    }
}

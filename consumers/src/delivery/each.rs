//! One delivery in a work transaction of its own: decode, claim, handle, commit, then settle
//! through the transport. The per-job loop runs every delivery so, a push transport runs the
//! one its request carries, and the grouped loop runs so the jobs of a group that lost a
//! conflict.

// tokio's clock: the same as the system's, but paused with a test's time, so that group
// sizing by the handlers' time is tested without waiting.
use tokio::time::Instant;

use jobs_core::{Claim, Delivery, JobId, Kind, QueueError, StoreError, WorkStore, WorkTransaction};
use tracing::Instrument;

use super::dead::rollback;
use super::{Context, Ready, ready_bounded, run_bounded};
use crate::handler::{Canceller, Prepared};
use crate::verdict::{Outcome, Tried};

impl<S: WorkStore> Context<S>
where
    S::Tx: Send,
{
    /// Processes one delivery to the end, settling it with the transport, and says what
    /// happened. A delivery of another queue than the worker's is refused, unsettled: filed
    /// under this worker's queue, its labels, dead letter and retries would be wrong.
    pub(crate) async fn process(&self, delivery: Delivery) -> Outcome {
        if delivery.queue() != &self.queue {
            let error = format!(
                "a delivery of `{}` was given to the worker of `{}`",
                delivery.queue(),
                self.queue
            );
            tracing::error!(queue = %self.queue, "{error}");
            return Outcome::Unsettled { error };
        }
        let triaged = self.triage(&delivery);
        let span = self.job_span(Ready::salvage_of(&triaged));
        let outcome = async {
            match triaged {
                Ok(ready) => self.run_ready(&delivery, ready).await,
                Err(reject) => {
                    let tried = Tried::Rejected {
                        reason: reject.reason,
                        error: reject.error,
                    };
                    self.conclude(&delivery, reject.salvage, tried).await
                }
            }
        }
        .instrument(span.clone())
        .await;
        span.in_scope(|| tracing::debug!(?outcome, "delivery settled"));
        outcome
    }

    /// Runs a job a handler takes: its readiness, then its work transaction, the lease kept
    /// for the whole of it (from the readiness, before any connection is taken, to the
    /// commit), then settles it.
    async fn run_ready(&self, delivery: &Delivery, ready: Ready<S::Tx>) -> Outcome {
        let Ready {
            prepared,
            salvage,
            kind,
            job_id,
            cancel,
            ..
        } = ready;
        let work = async {
            let limit = self.time_limit(&kind);
            match ready_bounded(&*prepared, limit, &cancel).await {
                Ok(()) => self.work(prepared, job_id, &kind, &cancel).await,
                Err(error) => Tried::Failed(error),
            }
        };
        // The lease went to another worker: nothing of this run may commit or settle.
        let tried = (self.with_lease(delivery, &cancel, work).await).unwrap_or(Tried::LeaseLost);
        self.conclude(delivery, salvage, tried).await
    }

    /// One delivery's work transaction, up to its commit or rollback: begin, claim, the
    /// handler within its time limit, commit. Whether a failed commit committed is unknown;
    /// the redelivery's claim will tell.
    async fn work(
        &self,
        prepared: Box<dyn Prepared<S::Tx>>,
        job_id: JobId,
        kind: &Kind,
        cancel: &Canceller,
    ) -> Tried {
        let limit = self.time_limit(kind);
        let mut tx = match self.store.begin_within(limit).await {
            Ok(tx) => tx,
            Err(e) => return self.store_unavailable(&e),
        };
        match tx.claim(job_id, &self.consumer, self.clock.now()).await {
            Ok(Claim::Claimed) => {}
            settled => {
                rollback(tx).await;
                return match settled {
                    // Settled before: processed, or dead-lettered (a replay releases the claim).
                    Ok(Claim::AlreadyProcessed | Claim::DeadLettered) => Tried::Duplicate,
                    // A claim this runtime does not know: not claimed, so not run here.
                    Ok(other) => {
                        let e = StoreError::failed(format!("unknown claim {other:?}"));
                        self.store_unavailable(&e)
                    }
                    Err(e) => self.store_unavailable(&e),
                };
            }
        }
        let started = Instant::now();
        let result = run_bounded(prepared, &mut tx, limit, cancel).await;
        self.timed(kind, started.elapsed());
        match result {
            Ok(()) => match tx.commit().await {
                Ok(()) => {
                    self.store_works();
                    Tried::Committed
                }
                Err(e) => self.store_unavailable(&e),
            },
            Err(error) => {
                rollback(tx).await;
                Tried::Failed(error)
            }
        }
    }

    /// Runs `work` while extending `delivery`'s lease every third of it. `None` when an
    /// extension finds the lease lost: `work` is dropped (its transaction rolls back) and the
    /// job's cancellation fires, since nothing it does can be settled any more.
    async fn with_lease<T>(
        &self,
        delivery: &Delivery,
        cancel: &Canceller,
        work: impl Future<Output = T>,
    ) -> Option<T> {
        let mut work = std::pin::pin!(work);
        let mut lease = delivery.lease.clone();
        let every = self.limits.lease / 3;
        loop {
            tokio::select! {
                biased;
                done = &mut work => return Some(done),
                () = tokio::time::sleep(every) => {
                    match self.settle.extend(&lease, self.limits.lease).await {
                        Ok(extended) => lease = extended,
                        Err(e @ QueueError::LeaseLost { .. }) => {
                            tracing::warn!(error = %e, "lease lost; stopping the job");
                            cancel.cancel();
                            return None;
                        }
                        Err(e) => tracing::warn!(error = %e, "could not extend the lease"),
                    }
                }
            }
        }
    }
}

//! Triage: decode a delivery and find its handler, or say why no handler runs it.

use jobs_core::{CorrelationId, Delivery, Envelope, JobId, Kind, TenantId, WorkStore};
use serde_json::Value;

use super::Context;
use crate::handler::{Canceller, Prepared};
use crate::verdict::DeadReason;

/// The envelope fields that could be read from a payload: for a job's span and its dead
/// letter.
#[derive(Default)]
pub(crate) struct Salvage {
    /// Whether the fields come from a valid envelope (then the job id is its identity), rather
    /// than from whatever a broken payload still holds.
    pub(crate) valid: bool,
    pub(crate) job_id: Option<JobId>,
    pub(crate) tenant_id: Option<TenantId>,
    pub(crate) kind: Option<Kind>,
    pub(crate) correlation_id: Option<CorrelationId>,
}

impl Salvage {
    fn of(envelope: &Envelope) -> Self {
        Salvage {
            valid: true,
            job_id: Some(envelope.job_id),
            tenant_id: Some(envelope.tenant_id),
            kind: Some(envelope.kind.clone()),
            correlation_id: Some(envelope.correlation_id),
        }
    }

    /// The same, with the tenant the transport stored beside the message where it kept one:
    /// that is the tenant whose operators must see the letter, whatever the broken payload
    /// claims.
    fn stored_for(mut self, delivery: &Delivery) -> Self {
        if delivery.tenant_id.is_some() {
            self.tenant_id = delivery.tenant_id;
        }
        self
    }

    /// Whatever valid fields a broken payload still has.
    fn from_bytes(payload: &[u8]) -> Self {
        let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(payload) else {
            return Salvage::default();
        };
        let field = |name: &str| map.get(name).and_then(Value::as_str);
        Salvage {
            valid: false,
            job_id: field("job_id").and_then(|s| s.parse().ok()),
            tenant_id: field("tenant_id").and_then(|s| s.parse().ok()),
            kind: field("kind").and_then(|s| s.parse().ok()),
            correlation_id: field("correlation_id").and_then(|s| s.parse().ok()),
        }
    }
}

/// A delivery decoded and matched to its handler, ready to run in a work transaction.
pub(crate) struct Ready<Tx: Send> {
    pub(crate) prepared: Box<dyn Prepared<Tx>>,
    pub(crate) salvage: Salvage,
    pub(crate) kind: Kind,
    pub(crate) job_id: JobId,
    /// [`Handler::RERUNNABLE`](crate::Handler::RERUNNABLE) of its handler.
    pub(crate) rerunnable: bool,
    /// Fires the job's [`Cancellation`](crate::Cancellation).
    pub(crate) cancel: Canceller,
}

/// A delivery no handler runs, and why: the verdict decides what becomes of it.
pub(crate) struct Reject {
    pub(crate) salvage: Salvage,
    pub(crate) reason: DeadReason,
    pub(crate) error: String,
}

impl<Tx: Send> Ready<Tx> {
    /// The envelope's fields a triage found, whatever it decided.
    pub(crate) fn salvage_of(triaged: &Result<Ready<Tx>, Reject>) -> &Salvage {
        match triaged {
            Ok(ready) => &ready.salvage,
            Err(reject) => &reject.salvage,
        }
    }
}

impl<S: WorkStore> Context<S>
where
    S::Tx: Send,
{
    /// Decodes the delivery and finds its handler, or says why no handler runs it (poison, an
    /// unknown kind, data that does not fit, an attempt beyond the policy's).
    pub(crate) fn triage(&self, delivery: &Delivery) -> Result<Ready<S::Tx>, Reject> {
        let envelope = match Envelope::decode_with(&delivery.payload, &self.limits.decode_limits) {
            Ok(envelope) => envelope,
            Err(e) => {
                return Err(Reject {
                    salvage: Salvage::from_bytes(&delivery.payload).stored_for(delivery),
                    reason: DeadReason::Poison,
                    error: e.to_string(),
                });
            }
        };
        let reject = |reason, error| Reject {
            salvage: Salvage::of(&envelope),
            reason,
            error,
        };
        if delivery.attempt > self.policy.max_attempts() {
            let error = format!(
                "delivered for attempt {} beyond the policy's {}",
                delivery.attempt,
                self.policy.max_attempts()
            );
            return Err(reject(DeadReason::Exhausted, error));
        }
        let Some(handler) = self.handlers.get(&envelope.kind) else {
            let error = format!(
                "`kind`: no handler registered for `{}` in consumer `{}`",
                envelope.kind, self.consumer
            );
            let reason = if self.unknown_is_poison {
                DeadReason::Poison
            } else {
                DeadReason::UnknownKind
            };
            return Err(reject(reason, error));
        };
        let (salvage, kind, job_id) = (
            Salvage::of(&envelope),
            envelope.kind.clone(),
            envelope.job_id,
        );
        let (cancel, cancellation) = Canceller::new(&self.shutting_down);
        match handler.prepare(envelope, self.queue.clone(), delivery.attempt, cancellation) {
            Ok(prepared) => Ok(Ready {
                prepared,
                salvage,
                kind,
                job_id,
                rerunnable: handler.rerunnable(),
                cancel,
            }),
            Err(e) => Err(Reject {
                salvage,
                reason: DeadReason::Poison,
                error: if self.limits.error_values {
                    e.with_values()
                } else {
                    e.to_string()
                },
            }),
        }
    }

    /// Whether a handler of this worker knows `kind`: only those label metrics, so that no
    /// producer can make up metric series.
    pub(crate) fn knows(&self, kind: &Kind) -> bool {
        self.handlers.contains_key(kind)
    }
}

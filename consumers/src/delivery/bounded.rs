//! Handler code within its time limit: past it the code is stopped, a panic becomes a failure.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use thiserror::Error;

use crate::handler::{Canceller, JobError, Prepared};

/// A handler stopped at its time limit.
#[derive(Debug, Error)]
#[error("the handler timed out after {0:?}; its writes were rolled back")]
struct TimedOut(Duration);

/// Runs a prepared job in `tx` within `limit` ([`bounded`]).
pub(crate) async fn run_bounded<Tx: Send>(
    prepared: Box<dyn Prepared<Tx>>,
    tx: &mut Tx,
    limit: Duration,
    cancel: &Canceller,
) -> Result<(), JobError> {
    bounded(prepared.run(tx), limit, cancel).await
}

/// Waits for a prepared job to be ready ([`Handler::ready`](crate::Handler::ready)) within
/// `limit` ([`bounded`]).
pub(crate) async fn ready_bounded<Tx: Send>(
    prepared: &dyn Prepared<Tx>,
    limit: Duration,
    cancel: &Canceller,
) -> Result<(), JobError> {
    bounded(prepared.ready(), limit, cancel).await
}

/// Handler code within `limit`: past it the future is dropped (it stops at its next
/// `.await`), the job's cancellation fires and the job fails with [`TimedOut`], retryable; a
/// panic becomes a retryable failure that names it.
async fn bounded(
    work: impl Future<Output = Result<(), JobError>>,
    limit: Duration,
    cancel: &Canceller,
) -> Result<(), JobError> {
    let caught = AssertUnwindSafe(work).catch_unwind();
    match tokio::time::timeout(limit, caught).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".to_owned());
            tracing::error!(panic = %message, "handler panicked");
            Err(JobError::retry(format!("handler panicked: {message}")))
        }
        Err(_) => {
            tracing::warn!(timeout = ?limit, "handler timed out");
            cancel.cancel();
            Err(JobError::retry(TimedOut(limit)))
        }
    }
}

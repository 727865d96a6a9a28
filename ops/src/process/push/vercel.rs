//! Vercel Queues' callbacks, when `VERCEL_QUEUES_PUSH=on`: `POST`
//! [`VERCEL_CALLBACK_PATH`] once per message. The callback names its queue, and one of a
//! queue this process does not serve is refused (400). A pushed payload runs only once its
//! receipt handle is confirmed (ADR 0009).

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use jobs_adapter_vercel_queues::VercelQueues;
use jobs_adapter_vercel_queues::push::{PushCallback, PushReply};
use jobs_consumers::Outcome;

use super::{Push, Routes, Served, VERCEL_CALLBACK_PATH};
use crate::compose::{
    self, Config, QUEUE_URL, Queue, VERCEL_QUEUES_PUSH, VERCEL_QUEUES_TRUST_PUSHED,
};
use crate::process::{ProcessError, refused};

/// The push side of a `vercel-queues://` queue, when [`VERCEL_QUEUES_PUSH`] is on.
pub(super) fn serve(config: &Config, queue: &Queue) -> Result<Option<Push>, ProcessError> {
    if queue.scheme != "vercel-queues" || !config.switch(&VERCEL_QUEUES_PUSH)? {
        return Ok(None);
    }
    let vercel = compose::vercel_queues_of(config)?;
    if config.switch(&VERCEL_QUEUES_TRUST_PUSHED)? {
        tracing::warn!(
            route = VERCEL_CALLBACK_PATH,
            "VERCEL_QUEUES_TRUST_PUSHED_PAYLOAD is on: pushed payloads run without their receipt \
             handle being confirmed, so anyone who can reach the route can run a job; keep it \
             on a route only the platform can reach"
        );
    }
    // Settled through the composed transport, so a depth count sees the acks.
    let Some(consumer) = queue.consumer.clone() else {
        return Err(refused(&QUEUE_URL, "names no Vercel Queues consumer"));
    };
    let routes: Routes = Box::new(move |served| {
        let served = Arc::new(served.clone());
        Ok(Router::new().route(
            VERCEL_CALLBACK_PATH,
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let (vercel, served) = (vercel.clone(), served.clone());
                    async move { callback(&vercel, &served, &headers, body).await }
                },
            ),
        ))
    });
    Ok(Some(Push {
        settle: consumer,
        transport: format!("vercel-queues: (callbacks on POST {VERCEL_CALLBACK_PATH})"),
        routes,
        ready: None,
    }))
}

/// One Vercel Queues callback through the worker of its queue.
async fn callback(
    vercel: &VercelQueues,
    served: &Served,
    headers: &axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> (StatusCode, String) {
    let reply = match PushCallback::parse(headers, body.to_vec()) {
        Err(e) => PushReply::BadRequest(e.to_string()),
        Ok(callback) => match served.get(callback.queue()) {
            None => PushReply::BadRequest(format!(
                "this process does not serve `{}`",
                callback.queue()
            )),
            Some(run) => {
                vercel
                    .handle_push(headers, body.to_vec(), |delivery| async move {
                        !matches!(run(delivery).await, Outcome::Unsettled { .. })
                    })
                    .await
            }
        },
    };
    let status = StatusCode::from_u16(reply.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, reply.body())
}

//! QStash's deliveries: `POST` on the path of each queue's destination
//! ([`QSTASH_DESTINATION`], `{queue}` replaced), verified by signature before anything of
//! the request is read; its `sub` claim must be that queue's URL, so a queue's route refuses
//! another's deliveries.

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use jobs_adapter_qstash::{Processed, PushConsumer, PushRequest, Receiver};
use jobs_consumers::Outcome;

use super::{Push, Routes, Run};
use crate::compose::{self, Config, QSTASH_DESTINATION, Queue};
use crate::process::endpoints::Ping;
use crate::process::{ProcessError, refused};

/// The push side of a `qstash:` queue.
pub(super) fn serve(config: &Config, queue: &Queue) -> Result<Option<Push>, ProcessError> {
    if queue.scheme != "qstash" {
        return Ok(None);
    }
    let publisher = compose::qstash_queue(config)?;
    let pinged = publisher.clone();
    let ready: Ping = Box::new(move || {
        let qstash = pinged.clone();
        Box::pin(async move {
            (qstash.ping().await).map_err(|e| format!("QStash does not answer: {e}"))
        })
    });
    let keys = compose::qstash_signing_keys(config)?;
    let consumer = Arc::new(PushConsumer::default());
    let settle = consumer.clone();
    let routes: Routes = Box::new(move |served| {
        let mut router = Router::new();
        for (name, run) in served {
            let url = publisher
                .config()
                .destination(name)
                .map(|d| d.url().to_owned())
                .ok_or_else(|| {
                    refused(
                        &QSTASH_DESTINATION,
                        &format!("names no destination for `{name}`"),
                    )
                })?;
            let path = url_path(&url).to_owned();
            let receiver = Arc::new(
                Receiver::new(name.clone(), url, keys.clone(), consumer.clone())
                    .with_republisher(publisher.clone()),
            );
            let run = run.clone();
            router = router.route(
                &path,
                axum::routing::post(
                    move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                        let (receiver, run) = (receiver.clone(), run.clone());
                        async move { delivery(&receiver, &run, &headers, body).await }
                    },
                ),
            );
        }
        Ok(router)
    });
    Ok(Some(Push {
        settle,
        transport: "qstash: (pushed to this process's routes)".to_owned(),
        routes,
        ready: Some(ready),
    }))
}

/// One QStash delivery through `run`, answered as the receiver says.
async fn delivery(
    receiver: &Receiver,
    run: &Run,
    headers: &axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let request = PushRequest::from_headers(headers, body.to_vec());
    let answer = receiver
        .handle(request, |delivery| async move {
            match run(delivery).await {
                Outcome::DeadLettered { .. } => Processed::DeadLettered,
                _ => Processed::Settled,
            }
        })
        .await;
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, answer.body).into_response();
    for (name, value) in answer.headers {
        if let Ok(value) = axum::http::HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .insert(axum::http::HeaderName::from_static(name), value);
        }
    }
    response
}

/// The path of `url` (`/qstash/billing.invoices` of `https://app.example/qstash/billing.invoices`).
fn url_path(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.find('/').map_or("/", |at| &rest[at..])
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_destinations_path_is_what_follows_its_host() {
        assert_eq!(
            super::url_path("https://app.example/qstash/billing.invoices"),
            "/qstash/billing.invoices"
        );
        assert_eq!(super::url_path("https://app.example"), "/");
    }
}

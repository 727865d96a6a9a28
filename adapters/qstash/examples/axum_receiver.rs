//! Mounting the QStash [`Receiver`] on an axum route.
//!
//! ```sh
//! cargo run -p jobs-adapter-qstash --example axum_receiver
//! ```
//!
//! Self-contained: it starts the testkit's QStash fake, serves the route on `127.0.0.1`,
//! publishes one job and prints what QStash was answered. In an application the closure given
//! to [`Receiver::handle`] runs the worker (`jobs_consumers::Worker::process`) built with the
//! same [`PushConsumer`] as its transport, and maps `Outcome::DeadLettered` to
//! [`Processed::DeadLettered`]; `testkit/tests/qstash_runtime.rs` does exactly that. Here the
//! closure settles the delivery itself, since an adapter's examples may not use the runtime.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use jobs_adapter_qstash::{
    Destination, Processed, PushConsumer, PushRequest, PushResponse, QStashConfig, QStashQueue,
    Receiver, SigningKeys,
};
use jobs_core::{PublishOptions, QueuePort, SettlePort};
use jobs_testkit::fakes::qstash::FakeQStash;

/// What the route needs: the receiver and the consumer the worker would be built with.
struct Endpoint {
    receiver: Receiver,
    consumer: Arc<PushConsumer>,
}

/// `POST /qstash/jobs`: verify, process, answer. The raw body is taken as bytes, never as
/// JSON: the signature covers the exact bytes.
async fn qstash_jobs(State(ep): State<Arc<Endpoint>>, headers: HeaderMap, body: Bytes) -> Response {
    let request = PushRequest::from_headers(&headers, body.to_vec());
    let consumer = Arc::clone(&ep.consumer);
    let answer = ep
        .receiver
        .handle(request, |delivery| async move {
            // In an application: `match worker.process(delivery).await { … }`.
            println!(
                "delivery {:?}, attempt {}: {}",
                delivery.message_id,
                delivery.attempt,
                String::from_utf8_lossy(&delivery.payload)
            );
            match consumer.ack(&delivery.lease).await {
                Ok(()) => Processed::Settled,
                Err(e) => {
                    eprintln!("ack refused: {e}");
                    Processed::Settled
                }
            }
        })
        .await;
    into_response(answer)
}

/// A [`PushResponse`] as an axum response.
fn into_response(answer: PushResponse) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, answer.body).into_response();
    for (name, value) in answer.headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .insert(HeaderName::from_static(name), value);
        }
    }
    response
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fake = FakeQStash::start().await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/qstash/jobs", listener.local_addr()?);
    let queue: jobs_core::QueueName = "example.jobs".parse()?;

    let publisher = QStashQueue::new(
        QStashConfig::new(fake.token())
            .with_base_url(fake.base_url())
            .with_destination(queue.clone(), Destination::new(url.clone())),
    )?;
    let consumer = Arc::new(PushConsumer::default());
    let receiver = Receiver::new(
        queue.clone(),
        url,
        SigningKeys::new(fake.current_signing_key(), fake.next_signing_key()),
        Arc::clone(&consumer),
    )
    .with_republisher(publisher.clone());
    let app = Router::new()
        .route("/qstash/jobs", post(qstash_jobs))
        .with_state(Arc::new(Endpoint { receiver, consumer }));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let envelope = jobs_testkit::fixtures::envelope(1, 1);
    let receipt = publisher
        .publish(&queue, &envelope, PublishOptions::default())
        .await?;
    println!("published {:?}", receipt.message_id);
    fake.wait_idle(Duration::from_secs(10)).await;
    for attempt in fake.attempts() {
        println!(
            "QStash delivered {} (retried {}) and was answered {:?}",
            attempt.message_id, attempt.retried, attempt.status
        );
    }
    Ok(())
}

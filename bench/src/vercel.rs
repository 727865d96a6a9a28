//! Vercel Queues through the adapter next to raw HTTP to the same server, Vercel's own offline
//! emulator (`python -m vercel.queue.devserver`, from `.venv`), in one run.
//!
//! Publish: `VercelQueues::publish` of an envelope against a bare `POST /api/v3/topic/{topic}`
//! with the same body and headers. Consume: `receive` of up to 10 then `ack` of each against a
//! bare receive (`Accept: multipart/mixed`, receipt handles picked out of the answer) and a
//! bare `DELETE` per handle. Both sides use one HTTP client shared by every task, at 1 and 8
//! concurrent tasks. The emulator is Python, so the server dominates both sides: the ratio says
//! what the adapter adds on top of the wire, not what Vercel can do.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support;
use anyhow::Result;
use jobs_adapter_vercel_queues::{Region, StaticToken, VercelQueues, VercelQueuesConfig, topic_of};
use jobs_core::{Envelope, PublishOptions, PullPort, QueueName, QueuePort, SettlePort};
use jobs_testkit::emulators::VercelQueuesEmulator;
use reqwest::Url;

const CONCURRENCY: [usize; 2] = [1, 8];
const LEASE: Duration = Duration::from_secs(300);

pub(crate) fn run() -> Result<()> {
    support::block_on(bench())
}

async fn bench() -> Result<()> {
    let messages: u64 = support::count("JOBS_BENCH_MESSAGES", 2_000)?;
    let emulator = VercelQueuesEmulator::start_devserver().await;
    let config = VercelQueuesConfig::new(Region::new("iad1")?, StaticToken::new("bench"))
        .base_url_override(emulator.base_url())?;
    let vercel = Arc::new(VercelQueues::new(config)?);
    let raw = Raw {
        client: reqwest::Client::new(),
        base: Url::parse(emulator.base_url())?,
    };
    println!("Vercel Queues on Vercel's emulator, {messages} messages per run, one client");
    println!(
        "{:>8}  {:>11}  {:>14}  {:>14}  {:>6}",
        "side", "concurrency", "raw HTTP/s", "adapter/s", "ratio"
    );
    for concurrency in CONCURRENCY {
        let q_raw: QueueName = format!("bench.raw{concurrency}").parse()?;
        let q_adapter: QueueName = format!("bench.adapter{concurrency}").parse()?;
        let baseline = raw.publish(&q_raw, concurrency, messages).await?;
        let measured = publish(&vercel, &q_adapter, concurrency, messages).await?;
        println!(
            "{:>8}  {concurrency:>11}  {baseline:>14.0}  {measured:>14.0}  {:>6.2}",
            "publish",
            measured / baseline
        );
        support::rate_row(
            "vercel",
            "publish",
            "adapter",
            concurrency,
            measured,
            baseline,
        );
        let baseline = raw.consume(&q_raw, concurrency, messages).await?;
        let measured = consume(&vercel, &q_adapter, concurrency, messages).await?;
        println!(
            "{:>8}  {concurrency:>11}  {baseline:>14.0}  {measured:>14.0}  {:>6.2}",
            "consume",
            measured / baseline
        );
        support::rate_row(
            "vercel",
            "consume",
            "adapter",
            concurrency,
            measured,
            baseline,
        );
    }
    Ok(())
}

fn envelope(n: u64) -> Envelope {
    jobs_testkit::fixtures::envelope(1, n)
}

/// Runs `work(i)` for i in 0..total over `concurrency` tasks; answers items per second.
async fn spread<F, Fut>(concurrency: usize, total: u64, work: F) -> Result<f64>
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<u64>> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (work, next, done) = (work.clone(), next.clone(), done.clone());
            tokio::spawn(async move {
                loop {
                    if done.load(Ordering::Relaxed) >= total {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let n = work(i).await?;
                    if n == 0 {
                        // Nothing to do right now: let the tasks with requests in flight run.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    done.fetch_add(n, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

async fn publish(
    vercel: &Arc<VercelQueues>,
    q: &QueueName,
    concurrency: usize,
    total: u64,
) -> Result<f64> {
    let (vercel, q) = (vercel.clone(), q.clone());
    spread(concurrency, total, move |i| {
        let (vercel, q) = (vercel.clone(), q.clone());
        async move {
            if i >= total {
                return Ok(0);
            }
            vercel
                .publish(&q, &envelope(i), PublishOptions::default())
                .await?;
            Ok(1)
        }
    })
    .await
}

async fn consume(
    vercel: &Arc<VercelQueues>,
    q: &QueueName,
    concurrency: usize,
    total: u64,
) -> Result<f64> {
    let (vercel, q) = (vercel.clone(), q.clone());
    spread(concurrency, total, move |_| {
        let (vercel, q) = (vercel.clone(), q.clone());
        async move {
            let got = vercel.receive(&q, 10, LEASE).await?;
            for delivery in &got {
                vercel.ack(&delivery.lease).await?;
            }
            Ok(got.len() as u64)
        }
    })
    .await
}

/// The baseline: the same requests, written by hand.
#[derive(Clone)]
struct Raw {
    client: reqwest::Client,
    base: Url,
}

impl Raw {
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("an http URL")
            .pop_if_empty()
            .extend(["api", "v3", "topic"])
            .extend(segments);
        url
    }

    async fn publish(&self, q: &QueueName, concurrency: usize, total: u64) -> Result<f64> {
        let (raw, topic) = (self.clone(), topic_of(q));
        spread(concurrency, total, move |i| {
            let (raw, topic) = (raw.clone(), topic.clone());
            async move {
                if i >= total {
                    return Ok(0);
                }
                let envelope = envelope(i);
                let status = raw
                    .client
                    .post(raw.url(&[&topic]))
                    .bearer_auth("bench")
                    .header("content-type", "application/json")
                    .header("vqs-idempotency-key", envelope.job_id.to_string())
                    .body(envelope.to_json_bytes()?)
                    .send()
                    .await?
                    .status();
                anyhow::ensure!(status.is_success(), "send answered {status}");
                Ok(1)
            }
        })
        .await
    }

    async fn consume(&self, q: &QueueName, concurrency: usize, total: u64) -> Result<f64> {
        let (raw, topic) = (self.clone(), topic_of(q));
        spread(concurrency, total, move |_| {
            let (raw, topic) = (raw.clone(), topic.clone());
            async move {
                let response = raw
                    .client
                    .post(raw.url(&[&topic, "consumer", "workers"]))
                    .bearer_auth("bench")
                    .header("accept", "multipart/mixed")
                    .header("vqs-max-messages", "10")
                    .header(
                        "vqs-visibility-timeout-seconds",
                        LEASE.as_secs().to_string(),
                    )
                    .send()
                    .await?;
                if response.status() == reqwest::StatusCode::NO_CONTENT {
                    return Ok(0);
                }
                let body = response.text().await?;
                let handles: Vec<&str> = body
                    .lines()
                    .filter_map(|line| line.strip_prefix("Vqs-Receipt-Handle: "))
                    .collect();
                for handle in &handles {
                    let status = raw
                        .client
                        .delete(raw.url(&[
                            &topic,
                            "consumer",
                            "workers",
                            "lease",
                            handle.trim_end(),
                        ]))
                        .bearer_auth("bench")
                        .send()
                        .await?
                        .status();
                    anyhow::ensure!(status.is_success(), "ack answered {status}");
                }
                Ok(handles.len() as u64)
            }
        })
        .await
    }
}

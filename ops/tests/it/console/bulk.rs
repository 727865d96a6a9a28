//! The console's bulk runs: a confirmation stating the count, a run journaled and settled once
//! per letter, a tenant's run limited to its letters, and a run stopped half-way resumed.

use super::*;

/// Runs `path`'s bulk form for `action` (`queue`: the filter) through its confirmation, and
/// waits for the run to finish: the confirmation page, and the run's page at the end.
async fn bulk(s: &Served, cookie: &str, action: &str, queue: &str) -> (String, String) {
    let (_, list) = s
        .get(Some(cookie), &format!("/letters?queue={queue}"))
        .await;
    let csrf = csrf_of(&list);
    let form = [
        ("csrf", csrf.as_str()),
        ("action", action),
        ("queue", queue),
    ];
    let post = |path: &'static str| {
        s.client
            .post(format!("{}{path}", s.base))
            .header(COOKIE, cookie)
            .header(ORIGIN, &s.base)
            .form(&form)
            .send()
    };
    let asked = post("/bulk").await.expect("an answer");
    assert_eq!(asked.status(), StatusCode::OK);
    let confirmation = asked.text().await.expect("a body");
    let started = post("/bulk/confirm").await.expect("an answer");
    assert_eq!(started.status(), StatusCode::SEE_OTHER);
    let run = started
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("the run's page")
        .to_owned();
    for _ in 0..200 {
        let (_, page) = s.get(Some(cookie), &run).await;
        if page.contains("<span id=\"state\">finished</span>") {
            return (confirmation, page);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the bulk run at {run} did not finish");
}

#[tokio::test]
async fn a_bulk_discard_states_its_count_first_and_settles_every_matching_letter_once() {
    let s = serve().await;
    let cookie = s.sign_in(OPERATOR).await;
    let (confirmation, run) = bulk(&s, &cookie, "discard", "billing.invoices").await;
    assert!(
        confirmation.contains("Discard 5 letters waiting for review"),
        "{confirmation}"
    );
    assert!(
        run.contains("<span id=\"done\">5</span> of 5 letters"),
        "{run}"
    );
    for id in &s.ids {
        assert_eq!(s.status(*id).await, DeadLetterStatus::Discarded);
    }
    let runs = jobs_core::BulkRuns::runs(&s.store, 10).await.expect("runs");
    assert_eq!(runs.len(), 1, "one run, journaled in the store");
    assert_eq!(runs[0].done(), 5);
    assert!(runs[0].is_finished());
    assert_eq!(runs[0].by, "console (alice)", "the token's name");
}

#[tokio::test]
async fn a_tenants_bulk_run_touches_its_own_letters_only() {
    let s = serve().await;
    let cookie = s.sign_in(TENANT_ONE).await;
    let (confirmation, _) = bulk(&s, &cookie, "discard", "billing.invoices").await;
    assert!(confirmation.contains("Discard 3 letters"), "{confirmation}");
    for own in &s.ids[..3] {
        assert_eq!(s.status(*own).await, DeadLetterStatus::Discarded);
    }
    for other in &s.ids[3..] {
        assert_eq!(s.status(*other).await, DeadLetterStatus::PendingReview);
    }
}

/// A queue that takes `allowed` publishes, then fails every one as unavailable until healed.
struct Flaky {
    queue: MemoryQueue,
    allowed: AtomicUsize,
}

#[async_trait::async_trait]
impl QueuePort for Flaky {
    async fn publish(
        &self,
        queue: &QueueName,
        envelope: &Envelope,
        opts: PublishOptions,
    ) -> Result<Receipt, QueueError> {
        let took = self
            .allowed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if took.is_err() {
            return Err(QueueError::Unavailable {
                queue: queue.clone(),
                message: "down for the test".to_owned(),
                source: None,
            });
        }
        self.queue.publish(queue, envelope, opts).await
    }
}

/// Polls the run at `run` until its state is `state`: the page then.
async fn run_reaches(s: &Served, cookie: &str, run: &str, state: &str) -> String {
    for _ in 0..250 {
        let (_, page) = s.get(Some(cookie), run).await;
        if page.contains(&format!("<span id=\"state\">{state}</span>")) {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the bulk run at {run} never reached `{state}`");
}

#[tokio::test]
async fn a_bulk_replay_stopped_by_a_failing_queue_is_resumed_from_its_page_and_replays_each_letter_once()
 {
    let queue = MemoryQueue::default();
    let flaky = Arc::new(Flaky {
        queue: queue.clone(),
        allowed: AtomicUsize::new(2),
    });
    let s = serve_with(queue, flaky.clone()).await;
    let cookie = s.sign_in(OPERATOR).await;
    let (_, list) = s
        .get(Some(&cookie), "/letters?queue=billing.invoices")
        .await;
    let csrf = csrf_of(&list);
    let started = s
        .client
        .post(format!("{}/bulk/confirm", s.base))
        .header(COOKIE, &cookie)
        .header(ORIGIN, &s.base)
        .form(&[
            ("csrf", csrf.as_str()),
            ("action", "replay"),
            ("queue", "billing.invoices"),
            ("kind", "billing.invoice_issued"),
        ])
        .send()
        .await
        .expect("an answer");
    assert_eq!(started.status(), StatusCode::SEE_OTHER);
    let run = started
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .expect("the run's page")
        .to_owned();
    let stopped = run_reaches(&s, &cookie, &run, "stopped before the end").await;
    assert!(
        stopped.contains("<span id=\"done\">2</span> of 4 letters"),
        "{stopped}"
    );
    assert!(stopped.contains(">Resume</button>"), "{stopped}");
    let mut waiting = 0;
    for id in &s.ids[..4] {
        waiting += usize::from(s.status(*id).await == DeadLetterStatus::PendingReview);
    }
    // A replay marks the letter, then publishes (deduplicated by the letter): the one whose
    // publish failed is marked but unsettled in the run, the one after it untouched.
    assert_eq!(waiting, 1, "the letter after the failure is still waiting");
    // The queue is back: resuming settles the rest, and no letter is published twice.
    flaky.allowed.store(usize::MAX, Ordering::SeqCst);
    let resumed = s
        .client
        .post(format!("{}{run}/resume", s.base))
        .header(COOKIE, &cookie)
        .header(ORIGIN, &s.base)
        .form(&[("csrf", csrf_of(&stopped).as_str())])
        .send()
        .await
        .expect("an answer");
    assert_eq!(resumed.status(), StatusCode::SEE_OTHER);
    let finished = run_reaches(&s, &cookie, &run, "finished").await;
    assert!(
        finished.contains("<span id=\"done\">4</span> of 4 letters"),
        "{finished}"
    );
    for id in &s.ids[..4] {
        assert_eq!(s.status(*id).await, DeadLetterStatus::Replayed);
    }
    let delivered = s
        .queue
        .receive(&queue_name(), 10, Duration::from_secs(30))
        .await
        .expect("receive");
    let mut jobs: Vec<_> = delivered
        .iter()
        .map(|d| Envelope::decode(&d.payload).expect("an envelope").job_id)
        .collect();
    jobs.sort();
    jobs.dedup();
    assert_eq!(
        (delivered.len(), jobs.len()),
        (4, 4),
        "each letter replayed once"
    );
}

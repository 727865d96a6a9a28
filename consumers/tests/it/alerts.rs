//! Coalesced dead-letter alerts: one per queue per window, the events in between counted into
//! the next, a window's boundary included in the next window, and the console alerter's line.

use std::sync::Arc;
use std::time::Duration;

use jobs_consumers::{CoalescingAlerter, ConsoleAlerter};
use jobs_core::{Alert, Alerter, DeadLetterReason, ManualClock, QueueName};

use crate::harness::RecordingAlerter;

const WINDOW: Duration = Duration::from_secs(60);

fn queue(name: &str) -> QueueName {
    name.parse().expect("a queue")
}

/// The alerter over a recorder and a manual clock.
fn coalescing() -> (CoalescingAlerter, RecordingAlerter, ManualClock) {
    let recorder = RecordingAlerter::default();
    let clock = ManualClock::default();
    let alerts =
        CoalescingAlerter::new(Arc::new(recorder.clone()), Arc::new(clock.clone()), WINDOW);
    (alerts, recorder, clock)
}

/// The alerts sent so far, once every queued one is answered.
async fn sent(alerts: &CoalescingAlerter, recorder: &RecordingAlerter) -> Vec<Alert> {
    tokio::time::timeout(Duration::from_secs(5), alerts.quiet())
        .await
        .expect("the alerts are answered");
    recorder.alerts.lock().expect("not poisoned").clone()
}

#[tokio::test]
async fn one_alert_per_window_counts_the_events_held_back() {
    let (alerts, recorder, clock) = coalescing();
    let billing = queue("billing.invoices");
    alerts.dead_lettered(
        &billing,
        DeadLetterReason::Exhausted,
        "customer 1 not found",
    );
    clock.advance(Duration::from_secs(30));
    alerts.dead_lettered(
        &billing,
        DeadLetterReason::Exhausted,
        "customer 2 not found",
    );
    clock.advance(WINDOW - Duration::from_secs(30) - Duration::from_millis(1));
    alerts.dead_lettered(
        &billing,
        DeadLetterReason::Exhausted,
        "customer 3 not found",
    );
    let first = sent(&alerts, &recorder).await;
    assert_eq!(first.len(), 1, "the window holds the next two back");
    assert_eq!(first[0].count, 1);
    assert_eq!(first[0].title, "1 job dead-lettered on billing.invoices");
    assert!(
        first[0].detail.contains("customer 1 not found")
            && first[0].detail.contains("(exhausted)")
            && first[0].detail.contains("--reason exhausted"),
        "the alert names the letter's reason: {}",
        first[0].detail
    );
    // Exactly at the window's end the next event is sent, counting the two held back.
    clock.advance(Duration::from_millis(1));
    alerts.dead_lettered(
        &billing,
        DeadLetterReason::Exhausted,
        "customer 4 not found",
    );
    let second = sent(&alerts, &recorder).await;
    assert_eq!(second.len(), 2);
    assert_eq!(second[1].count, 3);
    assert_eq!(second[1].title, "3 jobs dead-lettered on billing.invoices");
    assert!(second[1].detail.contains("customer 4 not found"));
    // A window later with nothing held back: a count of one again.
    clock.advance(WINDOW);
    alerts.dead_lettered(
        &billing,
        DeadLetterReason::Exhausted,
        "customer 5 not found",
    );
    let third = sent(&alerts, &recorder).await;
    assert_eq!(third.len(), 3);
    assert_eq!(third[2].count, 1);
}

#[tokio::test]
async fn queues_have_windows_of_their_own_and_a_flush_reports_what_was_held_back() {
    let (alerts, recorder, clock) = coalescing();
    let (billing, email) = (queue("billing.invoices"), queue("notif.email.marketing"));
    alerts.dead_lettered(&billing, DeadLetterReason::Exhausted, "first");
    alerts.dead_lettered(&email, DeadLetterReason::Exhausted, "bounced");
    alerts.dead_lettered(&billing, DeadLetterReason::Exhausted, "second");
    alerts.dead_lettered(&billing, DeadLetterReason::Exhausted, "third");
    assert_eq!(sent(&alerts, &recorder).await.len(), 2, "one per queue");
    alerts.flush();
    assert_eq!(
        sent(&alerts, &recorder).await.len(),
        2,
        "the window is still open"
    );
    clock.advance(WINDOW);
    alerts.flush();
    let all = sent(&alerts, &recorder).await;
    assert_eq!(all.len(), 3, "only billing held events back");
    assert_eq!(
        (all[2].queue.as_str(), all[2].count),
        ("billing.invoices", 2)
    );
    assert!(
        all[2].detail.contains("third"),
        "the latest error: {}",
        all[2].detail
    );
    alerts.flush();
    assert_eq!(
        sent(&alerts, &recorder).await.len(),
        3,
        "nothing held back twice"
    );
}

#[test]
fn the_alerters_say_what_they_are() {
    let (alerts, _, _) = coalescing();
    let shown = format!("{alerts:?}");
    assert!(
        shown.contains("CoalescingAlerter") && shown.contains("60s"),
        "{shown}"
    );
    assert!(format!("{:?}", ConsoleAlerter::default()).contains("ConsoleAlerter"));
}

#[tokio::test]
async fn the_console_alerter_writes_one_line_per_alert() {
    let out = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let alerter = ConsoleAlerter::writing_to(out.clone());
    let alert = Alert {
        queue: queue("billing.invoices"),
        title: "2 jobs dead-lettered on billing.invoices".to_owned(),
        detail: "Latest error: boom".to_owned(),
        count: 2,
    };
    alerter.alert(&alert).await.expect("written");
    alerter.alert(&alert).await.expect("written");
    let text = String::from_utf8(out.lock().expect("not poisoned").clone()).expect("text");
    assert_eq!(
        text,
        "alert: 2 jobs dead-lettered on billing.invoices (billing.invoices, 2 time(s)): \
         Latest error: boom\n"
            .repeat(2)
    );
}

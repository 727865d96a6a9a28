//! `jobsctl publish` and `jobsctl queues`: the real binary through the composed queue.

use std::process::Output;

use jobs_core::{CorrelationId, JobId};

use crate::cli::jobsctl;

const TENANT: &str = "0b6c5e5a-3c1f-4d8e-9a57-2f1e4c6b7d90";

fn publish(extra: &[&str]) -> Output {
    let base = [
        "publish",
        "--queue",
        "billing.invoices",
        "--kind",
        "billing.invoice_issued",
        "--tenant",
        TENANT,
    ];
    jobsctl(&[&base[..], extra].concat())
}

fn json(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("one JSON object")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn publish_mints_a_uuidv7_job_id_and_prints_it_or_the_receipt() {
    let plain = publish(&["--queue-url", "memory:", "--data", r#"{"invoice":42}"#]);
    assert!(plain.status.success(), "{plain:?}");
    let printed = String::from_utf8_lossy(&plain.stdout);
    let job: JobId = printed.trim().parse().expect("prints a UUIDv7 job id");
    assert!(job.unix_ms() > 0);

    let correlation = "0192f0a4-8d7e-7c3b-a1f2-6e5d4c3b2a19";
    let delayed = json(&publish(&[
        "--queue-url",
        "memory:",
        "--json",
        "--delay",
        "10m",
        "--correlation",
        correlation,
    ]));
    assert_eq!(delayed["correlation_id"], correlation);
    assert_eq!(delayed["delay_ms"], 600_000);
    assert_eq!(delayed["receipt"]["duplicate"], false);
    assert!(delayed["receipt"]["message_id"].is_string(), "{delayed}");
    let minted: JobId = delayed["job_id"]
        .as_str()
        .expect("a job id")
        .parse()
        .expect("UUIDv7");
    assert_ne!(minted, job, "every publish mints its own id");

    let file = std::env::temp_dir().join(format!("jobsctl-data-{}.json", std::process::id()));
    std::fs::write(&file, r#"{"invoice": 7}"#).expect("write");
    let data_file = format!("@{}", file.display());
    let scheduled = json(&publish(&[
        "--queue-url",
        "memory:",
        "--json",
        "--data",
        &data_file,
        "--at",
        "2026-12-01T03:00:00Z",
    ]));
    let _ = std::fs::remove_file(&file);
    assert_eq!(scheduled["at"], "2026-12-01T03:00:00Z");
    let own: CorrelationId = scheduled["correlation_id"]
        .as_str()
        .expect("set")
        .parse()
        .expect("a UUID");
    assert_eq!(
        own.to_string(),
        scheduled["job_id"].as_str().expect("set"),
        "a job without --correlation correlates with itself"
    );
}

#[test]
fn publish_refuses_bad_input_before_sending_anything() {
    let memory = ["--queue-url", "memory:"];
    for (args, code, says) in [
        (
            vec!["--delay", "1m", "--at", "2026-12-01T03:00:00Z"],
            2,
            "cannot be used with",
        ),
        (vec!["--data", "{not json"], 2, "--data is not JSON"),
        (vec!["--data", "@/no/such/file.json"], 2, "--data @/no/such"),
        (vec!["--delay", "10"], 2, "unit"),
    ] {
        let output = publish(&[&memory[..], &args].concat());
        assert_eq!(output.status.code(), Some(code), "{args:?}: {output:?}");
        assert!(
            stderr(&output).contains(says),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    let big = std::env::temp_dir().join(format!("jobsctl-big-{}.json", std::process::id()));
    // Data under the limit in an envelope over it: refused by the consumers' own check.
    std::fs::write(
        &big,
        format!(r#"{{"blob":"{}"}}"#, "x".repeat(1024 * 1024 - 100)),
    )
    .expect("write");
    let oversized = publish(&[&memory[..], &["--data", &format!("@{}", big.display())]].concat());
    let _ = std::fs::remove_file(&big);
    assert_eq!(oversized.status.code(), Some(1), "{oversized:?}");
    assert!(
        stderr(&oversized).contains("over the limit of 1048576"),
        "{}",
        stderr(&oversized)
    );
    // An input without end is read up to the limit, and refused there.
    let endless = publish(&[&memory[..], &["--data", "@/dev/zero"]].concat());
    assert_eq!(endless.status.code(), Some(2), "{endless:?}");
    assert!(
        stderr(&endless).contains("--data @/dev/zero: longer than the limit of 1048576 bytes"),
        "{}",
        stderr(&endless)
    );
    // A key twice: the consumers would dead-letter it, so it is not published.
    let twice = publish(&[&memory[..], &["--data", r#"{"invoice":1,"invoice":2}"#]].concat());
    assert_eq!(twice.status.code(), Some(1), "{twice:?}");
    assert!(
        stderr(&twice).contains("duplicate key at `data.invoice`"),
        "{}",
        stderr(&twice)
    );
    // Text after the value cannot add fields beside `data`.
    let smuggled = publish(&[&memory[..], &["--data", r#"{},"kind":"other.kind""#]].concat());
    assert_eq!(smuggled.status.code(), Some(2), "{smuggled:?}");
    assert!(
        stderr(&smuggled).contains("--data is not JSON"),
        "{}",
        stderr(&smuggled)
    );

    let bad_tenant = jobsctl(&[
        "publish",
        "--queue",
        "a.b",
        "--kind",
        "a.b",
        "--tenant",
        "nope",
        "--queue-url",
        "memory:",
    ]);
    assert_eq!(bad_tenant.status.code(), Some(2), "{bad_tenant:?}");

    let unconfigured = publish(&[]);
    assert_eq!(unconfigured.status.code(), Some(2), "{unconfigured:?}");
    assert!(
        stderr(&unconfigured).contains("--queue-url"),
        "{}",
        stderr(&unconfigured)
    );

    let unknown = publish(&["--queue-url", "kafka://user:secret@broker"]);
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
    assert!(
        stderr(&unknown).contains("--queue-url")
            && stderr(&unknown).contains("`kafka:`")
            && stderr(&unknown).contains("accepted: memory:")
            && !stderr(&unknown).contains("secret"),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn queues_reports_depth_per_named_queue_as_a_table_or_json() {
    let output = jobsctl(&[
        "queues",
        "--queue-url",
        "memory:",
        "--queue",
        "billing.invoices",
        "--queue",
        "notify.email",
        "--json",
    ]);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON Lines"))
        .collect();
    assert!(output.status.success(), "{output:?}");
    let names: Vec<&str> = lines.iter().filter_map(|l| l["queue"].as_str()).collect();
    assert_eq!(names, ["billing.invoices", "notify.email"]);
    assert!(
        lines
            .iter()
            .all(|l| l["total"] == 0 && l["in_flight"] == 0 && l["oldest_ready_seconds"] == 0.0),
        "a fresh in-process queue is empty, every state counted, nothing waiting: {lines:?}"
    );

    let table = jobsctl(&["queues"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{table:?}");
    assert!(
        text.lines()
            .next()
            .is_some_and(|h| h.contains("in flight") && h.contains("waited"))
            && text.contains("core.processed_jobs_cleanup"),
        "without names, the standard tasks' queues: {text}"
    );
}

//! Vendors' own local emulators, started per test.
//!
//! [`VercelQueuesEmulator`] runs Vercel's offline Queues emulator (PyPI
//! `vercel-queue[devserver]`, installed in the workspace's `.venv` by `cargo xtask ci` or
//! `cargo xtask emulators`) as a child process on a free port. It runs the emulator's app on its
//! manual clock (`testkit/emulators/vercel_queues.py`), so a contract suite moves its time
//! with [`TimeTravel`] instead of sleeping; [`VercelQueuesEmulator::start_devserver`] runs
//! the unmodified `python -m vercel.queue.devserver` on the wall clock instead.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use jobs_core::{Clock, ManualClock};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::TimeTravel;

/// The environment variable naming the Python that has `vercel-queue[devserver]`; by default
/// the workspace's `.venv/bin/python`.
pub const PYTHON_ENV: &str = "VERCEL_QUEUE_PYTHON";

/// Vercel's queue emulator, stopped when dropped.
#[derive(Debug)]
pub struct VercelQueuesEmulator {
    child: Child,
    base_url: String,
    clock: Option<ManualClock>,
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit lives in the workspace")
        .to_path_buf()
}

/// The Python to run the emulator with, or a panic that says how to install it.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os(PYTHON_ENV) {
        return python.into();
    }
    let python = workspace_root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "Vercel's queue emulator is not installed: {} is missing. Run `cargo xtask emulators` \
         (or `cargo xtask ci`), which creates .venv with `vercel-queue[devserver]`, or point \
         {PYTHON_ENV} at a Python that has it.",
        python.display()
    );
    python
}

impl VercelQueuesEmulator {
    /// Starts the emulator on its manual clock, which [`TimeTravel`] drives.
    pub async fn start() -> VercelQueuesEmulator {
        let script = workspace_root().join("testkit/emulators/vercel_queues.py");
        let mut emulator = Self::spawn(&[script.to_str().expect("a UTF-8 path")]).await;
        let now = emulator.clock_call("GET", "").await;
        emulator.clock = Some(ManualClock::new(now));
        emulator
    }

    /// Starts `python -m vercel.queue.devserver` as Vercel ships it, on the wall clock.
    pub async fn start_devserver() -> VercelQueuesEmulator {
        Self::spawn(&["-m", "vercel.queue.devserver"]).await
    }

    async fn spawn(args: &[&str]) -> VercelQueuesEmulator {
        let mut child = Command::new(python())
            .args(args)
            .args(["--host", "127.0.0.1", "--port", "0"])
            // The wrapper exits when its stdin closes, so a killed test leaves no server behind.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting Vercel's queue emulator");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        let read = tokio::time::timeout(
            Duration::from_secs(30),
            BufReader::new(stdout).read_line(&mut line),
        )
        .await;
        assert!(
            matches!(read, Ok(Ok(n)) if n > 0),
            "Vercel's queue emulator did not announce its address: {read:?}"
        );
        let announced: serde_json::Value =
            serde_json::from_str(&line).expect("the emulator prints one JSON line");
        let base_url = announced["baseUrl"]
            .as_str()
            .expect("the announcement has baseUrl")
            .to_owned();
        VercelQueuesEmulator {
            child,
            base_url,
            clock: None,
        }
    }

    /// `http://127.0.0.1:<port>`, to use as the adapter's base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The emulator's manual clock, to give the adapter so both agree on the time (`None` for
    /// the devserver, which runs on the wall clock).
    pub fn clock(&self) -> Option<ManualClock> {
        self.clock.clone()
    }

    /// Calls the wrapper's clock route.
    async fn clock_call(&self, method: &str, body: &str) -> SystemTime {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        let answer = reqwest::Client::new()
            .request(method, format!("{}/__emulator/clock", self.base_url))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .expect("the emulator answers");
        let status = answer.status();
        let json = answer.text().await.expect("reading the emulator's answer");
        assert!(status.is_success(), "clock route answered {status}: {json}");
        let now: serde_json::Value = serde_json::from_str(json.trim()).expect("a JSON body");
        UNIX_EPOCH + Duration::from_secs_f64(now["now"].as_f64().expect("now in seconds"))
    }
}

#[async_trait]
impl TimeTravel for VercelQueuesEmulator {
    fn now(&self) -> SystemTime {
        match &self.clock {
            Some(clock) => Clock::now(clock),
            None => SystemTime::now(),
        }
    }

    /// Moves the emulator's clock and the adapter's together; on the wall clock, sleeps.
    async fn advance(&self, by: Duration) {
        match &self.clock {
            Some(clock) => {
                let body = format!("{{\"advanceSeconds\": {}}}", by.as_secs_f64());
                self.clock_call("POST", &body).await;
                clock.advance(by);
            }
            None => tokio::time::sleep(by).await,
        }
    }
}

impl Drop for VercelQueuesEmulator {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

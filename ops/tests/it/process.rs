//! A test's child processes: polled for, reaped if the test fails, stopped by SIGTERM.
//! `jobsctl`'s tests use this file too (by path).

use std::process::{Child, Command};
use std::time::Duration;

/// Polls `check` every 100 ms for up to 30 s.
pub(crate) async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..300 {
        if let Some(found) = check().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within 30 s");
}

/// Kills the child if the test fails before it exits.
pub(crate) struct Reaped(pub(crate) Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends SIGTERM to `child` and waits for it to exit, with its log.
pub(crate) async fn terminate(child: Reaped) -> (std::process::ExitStatus, String) {
    let pid = child.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(killed.expect("kill runs").success());
    terminate_waited(child).await
}

/// Waits for `child`, already signalled, to exit, with its log.
pub(crate) async fn terminate_waited(mut child: Reaped) -> (std::process::ExitStatus, String) {
    let exited = eventually("the process exits", async || child.0.try_wait().ok()?).await;
    let mut log = String::new();
    if let Some(mut stderr) = child.0.stderr.take() {
        std::io::Read::read_to_string(&mut stderr, &mut log).expect("its log");
    }
    (exited, log)
}

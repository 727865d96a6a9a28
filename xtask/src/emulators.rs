//! Vendors' own emulators the tests run: installed into the workspace's `.venv` on demand.
//!
//! Vercel's offline Queues emulator ships on PyPI as `vercel-queue[devserver]`; the adapter's
//! tests start it per test from `.venv/bin/python` (see `jobs_testkit::emulators`). This step
//! creates the virtualenv and installs the pinned version when it is missing, so a clean
//! checkout needs nothing but Python 3 and the package index.

use std::path::Path;
use std::process::Command;

/// The emulator's package, pinned: its wire behaviour is what the adapter is tested against.
pub(crate) const VERCEL_QUEUE: &str = "vercel-queue[devserver]==0.10.0";

/// What the tests import: the devserver module and the ASGI server it runs on.
const PROBE: &str = "import vercel.queue.devserver, vercel.queue.embedded, uvicorn";

/// Ensures `.venv` under `root` can run the emulator; one message per problem.
pub(crate) fn ensure(root: &Path) -> anyhow::Result<Vec<String>> {
    let venv = root.join(".venv");
    let python = venv.join("bin/python");
    if python.exists() && succeeds(Command::new(&python).args(["-c", PROBE])) {
        return Ok(vec![]);
    }
    eprintln!("installing {VERCEL_QUEUE} into {}", venv.display());
    if !python.exists() && !succeeds(Command::new("python3").arg("-m").arg("venv").arg(&venv)) {
        return Ok(vec![format!(
            "creating the virtualenv {} failed: `python3 -m venv` must work (install python3 \
             with its venv module)",
            venv.display()
        )]);
    }
    let installed = succeeds(Command::new(&python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        VERCEL_QUEUE,
    ]));
    if !installed || !succeeds(Command::new(&python).args(["-c", PROBE])) {
        return Ok(vec![format!(
            "installing {VERCEL_QUEUE} into {} failed: the Vercel Queues adapter's tests need \
             Vercel's emulator; check that the package index is reachable, then re-run",
            venv.display()
        )]);
    }
    Ok(vec![])
}

fn succeeds(command: &mut Command) -> bool {
    command.status().is_ok_and(|status| status.success())
}

//! The operations console in a real browser: `e2e/`.
//!
//! Starts the console over an in-memory store of dead letters (the `console_fixture` example
//! of `jobs-ops`), and runs `node --test` on `e2e/test/`, which drives Debian's Chromium with
//! Playwright's core package (no browser of its own is downloaded). Screenshots of the main
//! pages land in `target/e2e-screenshots/`. Chromium is installed from the system's packages
//! when it is missing and this runs as root (as `.ci/run` does); otherwise the step says what
//! to install.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result};

use crate::conformance::{self, Servers, Suite};

/// Where Debian's package puts the browser.
const CHROMIUM: &str = "/usr/bin/chromium";
/// The sign-in token the fixture is started with.
const TOKEN: &str = "e2e-operator-token-0123";

/// Runs the browser tests of the workspace at `root`; one message per problem.
pub(crate) fn run(root: &Path) -> Result<Vec<String>> {
    let dir = root.join("e2e");
    let problems = conformance::node_problems("the browser tests", "to drive Chromium");
    if !problems.is_empty() {
        return Ok(problems);
    }
    let chromium = match chromium() {
        Ok(path) => path,
        Err(problem) => return Ok(vec![problem]),
    };
    if let Some(problem) = conformance::install_sdks(&dir)? {
        return Ok(vec![problem]);
    }
    let tests = conformance::test_files(&dir)?;
    let fixture = conformance::build_executable(root, "jobs-ops", "--example", "console_fixture")?;
    let mut servers = Servers::default();
    let child = servers.spawn(
        "the console fixture",
        Command::new(&fixture).env("JOBS_CONSOLE_TOKENS", TOKEN),
    )?;
    let lines = conformance::announcement("the console fixture", child, |line| {
        line.starts_with("console on ")
    })?;
    let url = lines
        .last()
        .and_then(|line| line.strip_prefix("console on "))
        .context("the console fixture printed no address")?
        .to_owned();
    let shots = screenshots(root);
    println!(
        "browser: node --test on {} files against {url}",
        tests.len()
    );
    let env = [
        ("CONSOLE_URL", url),
        ("CONSOLE_TOKEN", TOKEN.to_owned()),
        ("SCREENSHOTS", shots.display().to_string()),
        ("CHROMIUM", chromium.display().to_string()),
    ];
    let status = conformance::run_suite(&dir, &tests, &env)?;
    drop(servers);
    Ok(match status {
        Suite::Passed => {
            println!("browser: screenshots in {}", shots.display());
            vec![]
        }
        Suite::Failed(status) => vec![format!(
            "the console failed in the browser (node --test {status}, output above); \
             screenshots of the pages reached are in {}",
            shots.display()
        )],
        Suite::TimedOut => vec!["the browser tests ran too long and were stopped".to_owned()],
    })
}

/// The target directory's `e2e-screenshots`.
fn screenshots(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("e2e-screenshots")
}

/// Debian's Chromium (`CHROMIUM` overrides the path), installed with apt when missing and
/// allowed; else what to do.
fn chromium() -> Result<PathBuf, String> {
    let path = std::env::var_os("CHROMIUM").map_or_else(|| PathBuf::from(CHROMIUM), PathBuf::from);
    if path.exists() {
        return Ok(path);
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root {
        println!("browser: apt-get install chromium (it is missing)");
        let installed = Command::new("apt-get")
            .args(["install", "-y", "-q", "chromium"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if installed && path.exists() {
            return Ok(path);
        }
    }
    Err(format!(
        "the browser tests need Chromium at {}: install Debian's `chromium` package (and \
         `chromium-driver`), as .ci/run does, or set CHROMIUM to its path",
        path.display()
    ))
}

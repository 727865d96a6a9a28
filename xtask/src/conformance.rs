//! The vendors' official Node SDKs against the project's fakes: `conformance/`.
//!
//! The fakes in `testkit/src/fakes/` stand in for Resend, QStash and Vercel Queues in every
//! adapter test, so a fake that drifts from its vendor makes those tests prove nothing. This
//! step points Resend's, Upstash's and Vercel's own SDKs at the fakes (served by the
//! `jobs-fakes` binary) and at Vercel's offline emulator (from `.venv`, as
//! `jobs_testkit::emulators` starts it), and runs `node --test` on `conformance/test/`. What a
//! fake knowingly does differently is listed in `conformance/KNOWN-DIFFERENCES.md`.
//!
//! It needs Node.js 20 or newer with npm; `npm ci` installs the locked SDKs when
//! `conformance/node_modules` is missing or older than the lock file. Every process it starts
//! is killed when it returns, whatever happened.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail};

/// The oldest Node.js the SDKs support (each declares `engines.node >= 20`).
pub(crate) const MIN_NODE: u32 = 20;
/// How long a fake or the emulator may take to announce its address.
const STARTUP: Duration = Duration::from_secs(30);
/// How long the whole Node suite may run before it is stopped: it normally takes well under a
/// minute, so this only ends a run that hangs.
const SUITE_LIMIT: Duration = Duration::from_secs(300);
/// The line after which a `jobs-fakes` server has printed everything it announces.
const ANNOUNCED: &str = "Ctrl-C to stop.";
/// Variables that would switch an SDK to another mode (a dev server to download, a region's
/// credentials, Vercel's deployment pinning or local dev mode): never passed to the suite.
const CLEARED: &[&str] = &[
    "NODE_ENV",
    "NODE_OPTIONS",
    "QSTASH_DEV",
    "QSTASH_DEV_PORT",
    "QSTASH_REGION",
    "UPSTASH_REGION",
    "VERCEL_DEPLOYMENT_ID",
    "VERCEL_OIDC_TOKEN",
    "VERCEL_REGION",
    "RESEND_USER_AGENT",
];

/// Runs the conformance suite of the workspace at `root`; one message per problem, none when
/// the SDKs accept every fake.
pub(crate) fn run(root: &Path) -> Result<Vec<String>> {
    let dir = root.join("conformance");
    let problems = node_problems("the conformance suite", "to run the vendors' SDKs");
    if !problems.is_empty() {
        return Ok(problems);
    }
    if let Some(problem) = install_sdks(&dir)? {
        return Ok(vec![problem]);
    }
    let tests = test_files(&dir)?;
    if tests.is_empty() {
        return Ok(vec![format!(
            "no test files (*.test.mjs) in {}",
            dir.join("test").display()
        )]);
    }
    let fakes = build_fakes(root)?;
    let python = emulator_python(root);
    if !python.exists() {
        return Ok(vec![format!(
            "Vercel's queue emulator is not installed ({} is missing): run `cargo xtask \
             emulators`, or point VERCEL_QUEUE_PYTHON at a Python that has \
             vercel-queue[devserver]",
            python.display()
        )]);
    }

    let mut servers = Servers::default();
    let env = start_servers(&mut servers, &fakes, &python)?;
    println!("conformance: node --test on {} files", tests.len());
    let status = run_suite(&dir, &tests, &env)?;
    drop(servers);
    Ok(match status {
        Suite::Passed => Vec::new(),
        Suite::Failed(status) => vec![format!(
            "the vendors' SDKs rejected a fake (node --test {status}, output above); fix the \
             fake, or list a wording-only or unused-feature difference in \
             conformance/KNOWN-DIFFERENCES.md; conformance/README.md shows how to run the suite \
             alone"
        )],
        Suite::TimedOut => vec![format!(
            "the conformance suite ran longer than {} s and was stopped",
            SUITE_LIMIT.as_secs()
        )],
    })
}

/// What keeps `suite` from running Node.js tests (`why`: what it needs them for): Node.js
/// [`MIN_NODE`] or newer and npm on `PATH`; one message per problem.
pub(crate) fn node_problems(suite: &str, why: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (tool, fix) in [
        ("node", format!("install Node.js {MIN_NODE} or newer")),
        ("npm", "install npm (it ships with Node.js)".to_owned()),
    ] {
        match version(tool) {
            Some(found) if tool == "node" && node_major(&found).is_none_or(|m| m < MIN_NODE) => {
                problems.push(format!(
                    "{suite} needs Node.js {MIN_NODE} or newer, found {found}: {fix}"
                ));
            }
            Some(_) => {}
            None => problems.push(format!("{suite} needs `{tool}` on PATH {why}: {fix}")),
        }
    }
    problems
}

/// `tool --version`, trimmed, or `None` when it does not run.
pub(crate) fn version(tool: &str) -> Option<String> {
    let output = Command::new(tool)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The major version in `node --version`'s answer (`v20.20.2` → 20).
pub(crate) fn node_major(version: &str) -> Option<u32> {
    version
        .trim()
        .strip_prefix('v')?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Whether the installed SDKs are older than the lock file: `installed` is when npm last wrote
/// `node_modules/.package-lock.json` (`None` when it is missing), `lock` when
/// `package-lock.json` changed.
fn stale(installed: Option<SystemTime>, lock: SystemTime) -> bool {
    installed.is_none_or(|installed| installed < lock)
}

/// Runs `npm ci` in `dir` when the locked SDKs are not installed as locked; a problem message
/// when it fails.
pub(crate) fn install_sdks(dir: &Path) -> Result<Option<String>> {
    let lock = dir.join("package-lock.json");
    let locked = std::fs::metadata(&lock)
        .and_then(|m| m.modified())
        .with_context(|| format!("read {}", lock.display()))?;
    let installed = std::fs::metadata(dir.join("node_modules/.package-lock.json"))
        .and_then(|m| m.modified())
        .ok();
    if !stale(installed, locked) {
        return Ok(None);
    }
    println!(
        "npm ci in {} (the locked packages are not installed)",
        dir.display()
    );
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .status()
        .context("run npm ci")?;
    Ok((!status.success()).then(|| {
        format!(
            "`npm ci` in {} failed ({status}): the suite needs the packages of its lock file; \
             check that the npm registry is reachable, then re-run",
            dir.display()
        )
    }))
}

/// The suite's test files, `conformance/test/*.test.mjs`, relative to `dir`, sorted.
pub(crate) fn test_files(dir: &Path) -> Result<Vec<String>> {
    let test_dir = dir.join("test");
    let mut files = Vec::new();
    for entry in
        std::fs::read_dir(&test_dir).with_context(|| format!("read {}", test_dir.display()))?
    {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".test.mjs") {
            files.push(format!("test/{name}"));
        }
    }
    files.sort();
    Ok(files)
}

/// The cargo that runs us (`cargo xtask` sets `CARGO`), so the toolchain stays the same.
pub(crate) fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Builds the `jobs-fakes` binary and returns its path, wherever the target directory is.
fn build_fakes(root: &Path) -> Result<PathBuf> {
    build_executable(root, "jobs-testkit", "--bin", "jobs-fakes")
}

/// Builds target `name` of `package` (`kind`: `--bin` or `--example`) and returns its
/// executable's path, wherever the target directory is.
pub(crate) fn build_executable(
    root: &Path,
    package: &str,
    kind: &str,
    name: &str,
) -> Result<PathBuf> {
    println!("cargo build -p {package} {kind} {name}");
    let output = Command::new(cargo())
        .args(["build", "--quiet", "-p", package, kind, name])
        .arg("--message-format=json-render-diagnostics")
        .current_dir(root)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("run cargo build for {name}"))?;
    if !output.status.success() {
        bail!("building {name} failed ({})", output.status);
    }
    executable(&String::from_utf8_lossy(&output.stdout), name)
        .with_context(|| format!("cargo build reported no {name} executable"))
}

/// The executable cargo built for the binary target `name`, from `--message-format=json`
/// lines.
pub(crate) fn executable(messages: &str, name: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter(|message| message["target"]["name"] == name)
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
}

/// The Python that has `vercel-queue[devserver]`, as `jobs_testkit::emulators` picks it.
fn emulator_python(root: &Path) -> PathBuf {
    std::env::var_os("VERCEL_QUEUE_PYTHON")
        .map_or_else(|| root.join(".venv/bin/python"), PathBuf::from)
}

/// The servers the suite talks to, killed when dropped: also on an error or a panic, so a
/// failed run leaves nothing listening.
#[derive(Default)]
pub(crate) struct Servers {
    children: Vec<(String, Child)>,
    /// The emulator's stdin, kept open while it runs (testkit's wrapper exits when it closes).
    stdins: Vec<ChildStdin>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stdins.clear();
        for (name, child) in &mut self.children {
            if let Err(error) = child.kill() {
                eprintln!("conformance: stopping {name}: {error}");
            }
            let _ = child.wait();
        }
    }
}

impl Servers {
    /// Starts `command` with its stdout piped; it is killed with the others.
    pub(crate) fn spawn(&mut self, name: &str, command: &mut Command) -> Result<&mut Child> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start {name}"))?;
        if let Some(stdin) = child.stdin.take() {
            self.stdins.push(stdin);
        }
        self.children.push((name.to_owned(), child));
        Ok(&mut self.children.last_mut().expect("just pushed").1)
    }
}

/// Reads `child`'s stdout lines until `done` says the announcement is complete, at most
/// [`STARTUP`]; the rest of its output is then read and dropped so it never blocks.
pub(crate) fn announcement(
    name: &str,
    child: &mut Child,
    done: fn(&str) -> bool,
) -> Result<Vec<String>> {
    let stdout = child.stdout.take().context("piped stdout")?;
    let (lines, announced) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
            let text = line.trim_end().to_owned();
            line.clear();
            if lines.send(text).is_err() {
                break;
            }
        }
        // Keep draining: a full pipe would stall the server.
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    let deadline = Instant::now() + STARTUP;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match announced.recv_timeout(left) {
            Ok(line) => {
                let last = done(&line);
                seen.push(line);
                if last {
                    return Ok(seen);
                }
            }
            Err(_) => bail!(
                "{name} did not announce its address within {} s (it printed: {seen:?})",
                STARTUP.as_secs()
            ),
        }
    }
}

/// The `label: value` lines a `jobs-fakes` server prints (`  base URL: http://…`), by label.
fn labelled(lines: &[String]) -> HashMap<String, String> {
    lines
        .iter()
        .filter(|line| line.starts_with(' '))
        .filter_map(|line| line.trim().split_once(": "))
        .map(|(label, value)| (label.trim().to_owned(), value.trim().to_owned()))
        .collect()
}

/// The `baseUrl` of the emulator's one-line JSON announcement (`{"baseUrl": "http://…"}`).
fn emulator_url(line: &str) -> Option<String> {
    let announced: serde_json::Value = serde_json::from_str(line).ok()?;
    announced["baseUrl"].as_str().map(str::to_owned)
}

/// Starts one `jobs-fakes` server and returns the values it printed, by label.
fn start_fake(
    servers: &mut Servers,
    fakes: &Path,
    name: &str,
    args: &[&str],
) -> Result<HashMap<String, String>> {
    let child = servers.spawn(name, Command::new(fakes).args(args).args(["--port", "0"]))?;
    let lines = announcement(name, child, |line| line == ANNOUNCED)?;
    Ok(labelled(&lines))
}

/// One value a server announced, or an error naming what is missing.
fn take(values: &HashMap<String, String>, server: &str, label: &str) -> Result<String> {
    values
        .get(label)
        .cloned()
        .with_context(|| format!("{server} announced no `{label}` (it printed {values:?})"))
}

/// Starts every fake and the emulator; the environment the suite reads (see
/// `conformance/README.md`).
fn start_servers(
    servers: &mut Servers,
    fakes: &Path,
    python: &Path,
) -> Result<Vec<(&'static str, String)>> {
    let mut env = Vec::new();

    let resend = start_fake(
        servers,
        fakes,
        "the Resend fake",
        &["resend", "--rate-limit", "0"],
    )?;
    env.push((
        "RESEND_BASE_URL",
        take(&resend, "the Resend fake", "base URL")?,
    ));
    env.push((
        "RESEND_API_KEY",
        take(&resend, "the Resend fake", "API key")?,
    ));
    let limited = "the rate-limited Resend fake";
    let resend_limited = start_fake(servers, fakes, limited, &["resend"])?;
    env.push((
        "RESEND_RATE_LIMITED_BASE_URL",
        take(&resend_limited, limited, "base URL")?,
    ));

    let qstash = start_fake(servers, fakes, "the QStash fake", &["qstash"])?;
    for label in [
        "QSTASH_URL",
        "QSTASH_TOKEN",
        "QSTASH_CURRENT_SIGNING_KEY",
        "QSTASH_NEXT_SIGNING_KEY",
    ] {
        env.push((label, take(&qstash, "the QStash fake", label)?));
    }
    let rotated = "the QStash fake signing with the next key";
    let qstash_next = start_fake(servers, fakes, rotated, &["qstash", "--sign-with-next-key"])?;
    env.push((
        "QSTASH_NEXT_KEY_SIGNER_URL",
        take(&qstash_next, rotated, "QSTASH_URL")?,
    ));

    let vercel = start_fake(servers, fakes, "the Vercel Queues fake", &["vercel-queues"])?;
    env.push((
        "VERCEL_QUEUES_FAKE_URL",
        take(&vercel, "the Vercel Queues fake", "base URL")?,
    ));
    env.push((
        "VERCEL_QUEUES_FAKE_TOKEN",
        take(&vercel, "the Vercel Queues fake", "token")?,
    ));

    // As `jobs_testkit::emulators::VercelQueuesEmulator::start_devserver`: the unmodified
    // devserver on the wall clock (the SDK's lease renewals and delays are real time), any free
    // port, stdin held open, one JSON line with `baseUrl` on stdout.
    let emulator = "Vercel's queue emulator";
    let child = servers.spawn(
        emulator,
        Command::new(python).args([
            "-m",
            "vercel.queue.devserver",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ]),
    )?;
    let lines = announcement(emulator, child, |_| true)?;
    let url = lines
        .first()
        .and_then(|line| emulator_url(line))
        .with_context(|| format!("{emulator} announced no baseUrl: {lines:?}"))?;
    env.push(("VERCEL_QUEUES_EMULATOR_URL", url));
    Ok(env)
}

/// How the Node suite ended.
pub(crate) enum Suite {
    Passed,
    Failed(std::process::ExitStatus),
    TimedOut,
}

/// Runs `node --test` on `tests` in `dir` with `env`, output streamed; stopped after
/// [`SUITE_LIMIT`].
pub(crate) fn run_suite(
    dir: &Path,
    tests: &[String],
    env: &[(&'static str, String)],
) -> Result<Suite> {
    let mut command = Command::new("node");
    command
        .args(["--test", "--test-concurrency=8", "--test-timeout=60000"])
        .args(tests)
        .current_dir(dir)
        .stdin(Stdio::null())
        .env("UPSTASH_DISABLE_TELEMETRY", "1");
    for name in CLEARED {
        command.env_remove(name);
    }
    command.envs(env.iter().map(|(name, value)| (name, value)));
    let mut node = command.spawn().context("run node --test")?;
    let deadline = Instant::now() + SUITE_LIMIT;
    loop {
        if let Some(status) = node.try_wait().context("wait for node --test")? {
            return Ok(if status.success() {
                Suite::Passed
            } else {
                Suite::Failed(status)
            });
        }
        if Instant::now() >= deadline {
            let _ = node.kill();
            let _ = node.wait();
            return Ok(Suite::TimedOut);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn reads_the_values_a_fake_announces() {
        let resend = lines(
            "Resend fake listening\n  base URL: http://127.0.0.1:44311\n  API key:  re_local\n  \
             rate:     not enforced\n  control:  http://127.0.0.1:44311/_fake/ (see --help)\n\
             Ctrl-C to stop.",
        );
        let values = labelled(&resend);
        assert_eq!(values["base URL"], "http://127.0.0.1:44311");
        assert_eq!(values["API key"], "re_local");
        assert!(!values.contains_key("Resend fake listening"));

        let qstash = lines(
            "QStash fake listening\n  QSTASH_URL:                 http://127.0.0.1:35575\n  \
             QSTASH_TOKEN:               eyJ=\nCtrl-C to stop.",
        );
        let values = labelled(&qstash);
        assert_eq!(values["QSTASH_URL"], "http://127.0.0.1:35575");
        assert_eq!(values["QSTASH_TOKEN"], "eyJ=", "a value may end in `=`");
        assert_eq!(
            take(&values, "the QStash fake", "QSTASH_URL").unwrap(),
            "http://127.0.0.1:35575"
        );
        let missing = take(&values, "the QStash fake", "QSTASH_NEXT_SIGNING_KEY").unwrap_err();
        assert!(missing.to_string().contains("QSTASH_NEXT_SIGNING_KEY"));
    }

    #[test]
    fn reads_the_emulator_announcement() {
        assert_eq!(
            emulator_url(r#"{"baseUrl": "http://127.0.0.1:38025"}"#).as_deref(),
            Some("http://127.0.0.1:38025")
        );
        assert_eq!(emulator_url("INFO: started"), None);
        assert_eq!(emulator_url(r#"{"port": 1}"#), None);
    }

    #[test]
    fn finds_the_built_executable_among_cargo_messages() {
        let messages = [
            r#"{"reason":"compiler-artifact","target":{"name":"jobs_testkit","kind":["lib"]},"executable":null}"#,
            "not json",
            r#"{"reason":"compiler-artifact","target":{"name":"jobs-fakes","kind":["bin"]},"executable":"/t/debug/jobs-fakes"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        assert_eq!(
            executable(&messages, "jobs-fakes"),
            Some(PathBuf::from("/t/debug/jobs-fakes"))
        );
        assert_eq!(executable(&messages, "other"), None);
    }

    #[test]
    fn parses_node_versions() {
        assert_eq!(node_major("v20.20.2\n"), Some(20));
        assert_eq!(node_major("v22.1.0"), Some(22));
        assert_eq!(node_major("20.1.0"), None);
        assert_eq!(node_major(""), None);
    }

    #[test]
    fn installs_when_node_modules_is_missing_or_older_than_the_lock() {
        let lock = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        assert!(stale(None, lock));
        assert!(stale(Some(lock - Duration::from_secs(1)), lock));
        assert!(!stale(Some(lock), lock));
        assert!(!stale(Some(lock + Duration::from_secs(1)), lock));
    }
}

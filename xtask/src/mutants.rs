//! `cargo xtask mutants`: mutation testing of the runtime and the semantics crates with a
//! pinned cargo-mutants, each group of files against the tests that reach it, and a report of
//! caught / missed / unviable / timed out per file.
//!
//! A surviving mutant fails the run unless `xtask/equivalent-mutants.txt` lists it with the
//! reason it cannot change behaviour; listed ones may be at most [`MAX_EQUIVALENT_PERCENT`] of
//! the viable mutants of a full run, and an entry whose mutant is caught must go.
//!
//! Mutants are applied in the source tree (`--in-place`, reusing the target directory's
//! incremental builds), so the run refuses to start over uncommitted changes to the files it
//! mutates: after an interrupted run, `git checkout` of them restores the sources.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::conformance;

/// The cargo-mutants release the figures in ARCHITECTURE.md were measured with.
pub(crate) const VERSION: &str = "27.0.0";

/// The committed list of equivalent mutants, one `FILE: MUTATION -- REASON` a line.
const EQUIVALENT: &str = "xtask/equivalent-mutants.txt";

/// Listed equivalent mutants allowed, in percent of the viable ones of a full run.
const MAX_EQUIVALENT_PERCENT: usize = 3;

/// Mutants of some files, tested by the tests that reach them.
struct Group {
    /// Names the group in the report and its output directory.
    name: &'static str,
    /// The package whose files are mutated.
    package: &'static str,
    /// Globs of the mutated files.
    files: &'static [&'static str],
    /// Only mutants whose names match this regex, when set.
    only: Option<&'static str>,
    /// The packages whose tests run, when not `package`.
    test_packages: &'static [&'static str],
    /// Features the tests need.
    features: &'static [&'static str],
    /// Arguments to `cargo test` choosing the tests.
    test_args: &'static [&'static str],
    /// Test only the mutants of these files that the named group missed: slower tests
    /// (a real database) asked about what the fast ones let through.
    missed_by: Option<&'static str>,
    /// The least time a mutant's tests get before it counts as timed out (a hang is caught).
    /// Fast suites hang at once; a real database's may be slow on a loaded machine.
    min_timeout_secs: u32,
    /// Run the tests with nextest's `mutants` profile (`.config/nextest.toml`): the first
    /// failing test ends the run, and a test still running after 6 s is killed and fails.
    /// For suites whose every test takes well under a second, on paused time: there a
    /// mutant that makes a loop spin never lets the clock move, so no deadline of the test's
    /// own can fire, and under `cargo test` it holds the whole binary to the timeout.
    nextest: bool,
}

/// Own tests of a package, without its doctests (their builds dominate a mutant's time and
/// every behaviour they show is tested beside them).
const OWN_TESTS: &[&str] = &["--lib", "--tests"];

impl Group {
    /// A package's files against its own tests, hangs caught after `min_timeout_secs`.
    const fn own(
        name: &'static str,
        package: &'static str,
        files: &'static [&'static str],
        min_timeout_secs: u32,
    ) -> Group {
        Group {
            name,
            package,
            files,
            only: None,
            test_packages: &[],
            features: &[],
            test_args: OWN_TESTS,
            missed_by: None,
            min_timeout_secs,
            nextest: false,
        }
    }
}

/// Test threads for the suites on PostgreSQL, which mostly wait on the database: a mutant
/// that stops the queue makes several tests wait out their minute-long deadlines, and with
/// one thread a core those queue behind one another past the timeout (a hang, counted as
/// caught) where together they fail in about a minute (caught, and said so).
const PG_TEST_THREADS: &str = "--test-threads=8";

/// The PostgreSQL adapter's queue tests and its grouped suite (`grouped::`, which alone gives
/// a group's jobs back), for the groups that mutate the grouped runtime and its PostgreSQL side.
const PG_QUEUE_TESTS: &[&str] = &[
    "--test",
    "it",
    "--",
    "queue::",
    "grouped::",
    "mark::",
    PG_TEST_THREADS,
];

const GROUPS: &[Group] = &[
    Group {
        nextest: true,
        ..Group::own("consumers", "jobs-consumers", &["consumers/src/**"], 20)
    },
    // The runtime on PostgreSQL: what its own tests (on the memory pair) missed, against the
    // model and the grouped suite on a real queue and store and the reference composition's
    // grouped tests (killed connections, statement_timeout, a deferred constraint).
    Group {
        name: "consumers-on-postgres",
        package: "jobs-consumers",
        files: &[
            "consumers/src/grouped/**",
            "consumers/src/delivery/**",
            "consumers/src/worker/**",
            "consumers/src/lifecycle.rs",
            "consumers/src/verdict.rs",
            "consumers/src/handler.rs",
        ],
        only: None,
        test_packages: &["jobs-adapter-postgres", "jobs-ops"],
        // The features jobs-ops' `it` tests require (it has no default features).
        features: &[
            "jobs-adapter-postgres/queue",
            "jobs-ops/postgres",
            "jobs-ops/sqlite",
            "jobs-ops/vercel-queues",
            "jobs-ops/qstash",
        ],
        test_args: PG_QUEUE_TESTS,
        missed_by: Some("consumers"),
        min_timeout_secs: 120,
        nextest: false,
    },
    // The PostgreSQL side of the grouped path: leasing, taking, claiming and settling inside
    // the work transaction, the lease tokens, the work transaction's group side, and the
    // idle loop's wait for work.
    Group {
        name: "postgres-grouped",
        package: "jobs-adapter-postgres",
        files: &[
            "adapters/postgres/src/queue/**",
            "adapters/postgres/src/tx.rs",
        ],
        only: Some(
            r"SettleInTransaction|GroupTransaction for PgWorkTx|WorkTransaction for PgWorkTx>::commit|PullPort for PgQueue>::receive|Leased::deliveries|keep_taken|PgQueue::settle|in tokens|replace tokens|parse_token|replace token |PullPort for PgQueue>::wait_for_work|PgQueue::next_due",
        ),
        test_packages: &[],
        features: &["jobs-adapter-postgres/queue"],
        test_args: PG_QUEUE_TESTS,
        missed_by: None,
        min_timeout_secs: 120,
        nextest: false,
    },
    // The low-water marks (ADR 0015): their rules, and the outbox relay's, against their unit
    // tests and the mark, outbox and queue suites on a real PostgreSQL.
    Group {
        name: "postgres-mark",
        package: "jobs-adapter-postgres",
        files: &[
            "adapters/postgres/src/mark.rs",
            "adapters/postgres/src/outbox.rs",
        ],
        only: None,
        test_packages: &[],
        features: &["jobs-adapter-postgres/queue"],
        test_args: &[
            "--lib",
            "--test",
            "it",
            "--",
            "mark::",
            "outbox::",
            "queue::",
            PG_TEST_THREADS,
        ],
        missed_by: None,
        min_timeout_secs: 120,
        nextest: false,
    },
    // The sliced claims table (ADR 0014): the slot, the statement per slice, the cleanup that
    // empties expired slices, against their unit tests and the processed and store suites.
    Group {
        name: "postgres-processed",
        package: "jobs-adapter-postgres",
        files: &["adapters/postgres/src/processed.rs"],
        only: None,
        test_packages: &[],
        features: &[],
        test_args: &[
            "--lib",
            "--test",
            "it",
            "--",
            "processed::",
            "store::",
            PG_TEST_THREADS,
        ],
        missed_by: None,
        min_timeout_secs: 120,
        nextest: false,
    },
    // The fair fetch's marks per lane (ADR 0015): its rules against its unit tests, the mark
    // suite and the queue suites (the fair contract and the fairness contract among them).
    Group {
        name: "postgres-fair",
        package: "jobs-adapter-postgres",
        files: &["adapters/postgres/src/fair.rs"],
        only: None,
        test_packages: &[],
        features: &["jobs-adapter-postgres/queue"],
        test_args: &[
            "--lib",
            "--test",
            "it",
            "--",
            "fair::",
            "mark::",
            "queue::",
            PG_TEST_THREADS,
        ],
        missed_by: None,
        min_timeout_secs: 120,
        nextest: false,
    },
    Group::own(
        "notifications",
        "jobs-notifications",
        &["notifications/src/**"],
        20,
    ),
    Group::own("cron", "jobs-cron", &["cron/src/**"], 20),
    Group::own(
        "redis",
        "jobs-adapter-redis",
        &["adapters/redis/src/lib.rs"],
        120,
    ),
];

/// The base `--in-diff` compares with when none is given, and CI's unless
/// `JOBS_MUTANTS_BASE` says otherwise: the last commit's changes.
pub(crate) const DEFAULT_BASE: &str = "HEAD~1";

/// The CI step: the mutants of the last commit (`JOBS_MUTANTS_BASE` to compare with another
/// base). A tree with uncommitted changes to the mutated files is left alone, saying so: CI's
/// clean checkout runs it.
pub(crate) fn ci(root: &Path) -> Result<Vec<String>> {
    let left = leftovers(root)?;
    if !left.is_empty() {
        return Ok(left);
    }
    let dirty = uncommitted(root)?;
    if !dirty.is_empty() {
        println!(
            "mutants: not run over uncommitted changes to {} (sources are mutated in place); \
             a clean checkout runs it",
            dirty.join(", ")
        );
        return Ok(vec![]);
    }
    let base = std::env::var("JOBS_MUTANTS_BASE").unwrap_or_else(|_| DEFAULT_BASE.to_owned());
    run(root, &Scope::InDiff(base))
}

/// What to run: every mutant, or those of lines a diff against a base touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    All,
    InDiff(String),
}

/// How one mutant ended, best first: a mutant tested twice keeps its best outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fate {
    Caught,
    TimedOut,
    Missed,
    Unviable,
}

/// `cargo xtask mutants [--in-diff BASE]`: one message per problem.
pub(crate) fn run(root: &Path, scope: &Scope) -> Result<Vec<String>> {
    let left = leftovers(root)?;
    if !left.is_empty() {
        return Ok(left);
    }
    let equivalent = read_equivalent(&root.join(EQUIVALENT))?;
    install()?;
    let out = target_dir(root).join("mutants");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let diff = match scope {
        Scope::All => None,
        Scope::InDiff(base) => Some(write_diff(root, base, &out)?),
    };
    let dirty = uncommitted(root)?;
    if !dirty.is_empty() {
        return Ok(vec![format!(
            "cargo xtask mutants mutates sources in place: commit or stash the changes to {} \
             first",
            dirty.join(", ")
        )]);
    }
    let chosen = chosen_groups()?;
    let mut fates: BTreeMap<String, (String, Fate)> = BTreeMap::new();
    let mut missed_by_group: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for group in GROUPS.iter().filter(|g| chosen.contains(&g.name)) {
        let only_names = match group.missed_by {
            None => None,
            Some(earlier) => {
                let names: Vec<String> = missed_by_group
                    .get(earlier)
                    .map(|missed| {
                        missed
                            .iter()
                            .filter(|name| group.files.iter().any(|f| name.starts_with(f)))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                if names.is_empty() {
                    println!("mutants: {}: nothing {earlier} missed to ask", group.name);
                    continue;
                }
                Some(names)
            }
        };
        let dir = out.join(group.name);
        let outcomes = run_group(root, group, diff.as_deref(), only_names.as_deref(), &dir)?;
        let missed = missed_by_group.entry(group.name).or_default();
        for (name, file, fate) in outcomes {
            if fate == Fate::Missed {
                missed.push(name.clone());
            }
            let entry = fates.entry(name).or_insert((file, fate));
            entry.1 = entry.1.min(fate);
        }
    }
    let report = Report::new(&fates, &equivalent);
    print!("{}", report.table());
    Ok(report.problems(*scope == Scope::All))
}

/// The groups `JOBS_MUTANTS_GROUPS` names (comma-separated), every one when unset. A group
/// that tests what another missed runs only beside it.
fn chosen_groups() -> Result<Vec<&'static str>> {
    let Ok(list) = std::env::var("JOBS_MUTANTS_GROUPS") else {
        return Ok(GROUPS.iter().map(|g| g.name).collect());
    };
    let mut chosen = vec![];
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let Some(group) = GROUPS.iter().find(|g| g.name == name) else {
            let known: Vec<&str> = GROUPS.iter().map(|g| g.name).collect();
            bail!(
                "JOBS_MUTANTS_GROUPS: no group `{name}` (groups: {})",
                known.join(", ")
            );
        };
        chosen.push(group.name);
    }
    Ok(chosen)
}

/// Installs the pinned cargo-mutants when another version or none is installed.
fn install() -> Result<()> {
    let installed = Command::new(conformance::cargo())
        .args(["mutants", "--version"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if installed.as_deref() == Some(&format!("cargo-mutants {VERSION}")) {
        return Ok(());
    }
    println!(
        "mutants: installing cargo-mutants {VERSION} (found {})",
        installed.as_deref().unwrap_or("none")
    );
    let status = Command::new(conformance::cargo())
        .args(["install", "cargo-mutants", "--locked", "--version", VERSION])
        .status()
        .context("running cargo install")?;
    if !status.success() {
        bail!("cargo install cargo-mutants --version {VERSION} failed ({status})");
    }
    Ok(())
}

/// The diff of the working tree against `base`, written where cargo-mutants reads it.
fn write_diff(root: &Path, base: &str, out: &Path) -> Result<PathBuf> {
    let diff = Command::new("git")
        .args(["diff", "--no-color", "--no-ext-diff", base, "--", "*.rs"])
        .current_dir(root)
        .output()
        .context("running git diff")?;
    if !diff.status.success() {
        bail!(
            "git diff {base} failed: {} (is {base} a commit of this clone?)",
            String::from_utf8_lossy(&diff.stderr).trim()
        );
    }
    let path = out.join("in-diff.patch");
    std::fs::write(&path, &diff.stdout).with_context(|| format!("writing {}", path.display()))?;
    println!(
        "mutants: only lines changed since {base} ({} lines of diff)",
        diff.stdout.iter().filter(|b| **b == b'\n').count()
    );
    Ok(path)
}

/// What cargo-mutants marks a mutated line with; none may be left in the sources.
const MARK: &str = concat!("changed by ", "cargo-mutants");

/// Sources that still hold a mutant (a run killed mid-way, or one committed by mistake).
fn leftovers(root: &Path) -> Result<Vec<String>> {
    let found = Command::new("git")
        .args([
            "grep",
            "--files-with-matches",
            "--fixed-strings",
            MARK,
            "--",
            "*.rs",
        ])
        .current_dir(root)
        .output()
        .context("running git grep")?;
    Ok(String::from_utf8_lossy(&found.stdout)
        .lines()
        .map(|file| {
            format!("{file} holds a mutant cargo-mutants left (`{MARK}`): `git checkout` it")
        })
        .collect())
}

/// Files of the groups with uncommitted changes.
fn uncommitted(root: &Path) -> Result<Vec<String>> {
    let mut args = vec!["status", "--porcelain", "--"];
    let dirs: BTreeSet<&str> = GROUPS
        .iter()
        .flat_map(|g| g.files.iter())
        .map(|f| f.trim_end_matches("/**"))
        .collect();
    args.extend(dirs);
    let status = Command::new("git")
        .args(&args)
        .current_dir(root)
        .output()
        .context("running git status")?;
    Ok(String::from_utf8_lossy(&status.stdout)
        .lines()
        .map(|line| line.get(3..).unwrap_or(line).to_owned())
        .collect())
}

/// Runs one group; its mutants' (name, file, fate).
fn run_group(
    root: &Path,
    group: &Group,
    diff: Option<&Path>,
    only_names: Option<&[String]>,
    dir: &Path,
) -> Result<Vec<(String, String, Fate)>> {
    let mut command = Command::new(conformance::cargo());
    command
        .current_dir(root)
        // A property a mutant breaks must not leave a regression file in the sources.
        .env("PROPTEST_DISABLE_FAILURE_PERSISTENCE", "1")
        .args(["mutants", "--in-place", "--no-shuffle", "--colors", "never"])
        .args(["--package", group.package])
        .arg(format!("--minimum-test-timeout={}", group.min_timeout_secs))
        .arg("--output")
        .arg(dir);
    if group.nextest {
        if crate::has_nextest() {
            command
                .args(["--test-tool", "nextest"])
                .env("NEXTEST_PROFILE", "mutants");
        } else {
            println!(
                "mutants: cargo-nextest is not installed; {} runs under cargo test, where a \
                 mutant that makes a loop spin times out",
                group.name
            );
        }
    }
    for file in group.files {
        command.args(["--file", file]);
    }
    if let Some(only) = group.only {
        command.args(["--re", only]);
    }
    if let Some(names) = only_names {
        for name in names {
            command.args(["--re", &format!("^{}$", escape_regex(name))]);
        }
    }
    if !group.test_packages.is_empty() {
        // cargo-mutants' own baseline runs the mutated package's tests, not these.
        baseline(root, group)?;
        for package in group.test_packages {
            command.args(["--test-package", package]);
        }
        command.args(["--baseline", "skip", "--timeout", "300"]);
    }
    if !group.features.is_empty() {
        // For the build and the tests alike, and named by package: the tests' package may
        // not be the mutated one.
        command.arg(format!(
            "--cargo-arg=--features={}",
            group.features.join(",")
        ));
    }
    if let Some(diff) = diff {
        command.arg("--in-diff").arg(diff);
    }
    if std::env::var_os("JOBS_MUTANTS_ITERATE").is_some() {
        // Only what the group's last run did not catch, and mutants new since.
        command.arg("--iterate");
    } else {
        // A run that finds no mutant writes no outcomes: an earlier run's must not be read.
        let old = dir.join("mutants.out");
        if old.exists() {
            std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
        }
    }
    command.arg("--").args(group.test_args);
    println!("\n==> mutants: {} ({})", group.name, group.files.join(" "));
    // Its exit status says whether mutants were missed; the outcomes say which.
    let status = command.status().context("running cargo mutants")?;
    let outcomes = dir.join("mutants.out").join("outcomes.json");
    if !outcomes.exists() {
        if status.success() {
            return Ok(vec![]);
        }
        bail!(
            "cargo mutants for {} failed ({status}) before testing any mutant",
            group.name
        );
    }
    let text = std::fs::read_to_string(&outcomes)
        .with_context(|| format!("reading {}", outcomes.display()))?;
    let parsed =
        parse_outcomes(&text).with_context(|| format!("reading {}", outcomes.display()))?;
    if parsed.baseline_failed {
        bail!(
            "the tests of {} fail without any mutant: fix them first (log in {})",
            group.name,
            dir.join("mutants.out").display()
        );
    }
    Ok(parsed.mutants)
}

/// The group's tests on the unmutated tree: they must pass before any mutant says anything.
fn baseline(root: &Path, group: &Group) -> Result<()> {
    let mut command = Command::new(conformance::cargo());
    command.current_dir(root).arg("test");
    for package in group.test_packages {
        command.args(["--package", package]);
    }
    if !group.features.is_empty() {
        command.arg(format!("--features={}", group.features.join(",")));
    }
    command.args(group.test_args);
    let status = command.status().context("running cargo test")?;
    if !status.success() {
        bail!(
            "the tests of {} fail without any mutant ({status}): fix them first",
            group.name
        );
    }
    Ok(())
}

struct Outcomes {
    baseline_failed: bool,
    mutants: Vec<(String, String, Fate)>,
}

/// Reads cargo-mutants' `outcomes.json`.
fn parse_outcomes(text: &str) -> Result<Outcomes> {
    let json: Value = serde_json::from_str(text)?;
    let mut parsed = Outcomes {
        baseline_failed: false,
        mutants: vec![],
    };
    for outcome in json["outcomes"].as_array().context("no `outcomes` array")? {
        let summary = outcome["summary"].as_str().unwrap_or_default();
        if outcome["scenario"] == "Baseline" {
            parsed.baseline_failed = summary != "Success";
            continue;
        }
        let mutant = &outcome["scenario"]["Mutant"];
        let (Some(name), Some(file)) = (mutant["name"].as_str(), mutant["file"].as_str()) else {
            bail!("an outcome without a mutant's name and file: {outcome}");
        };
        let fate = match summary {
            "CaughtMutant" => Fate::Caught,
            "MissedMutant" => Fate::Missed,
            "Timeout" => Fate::TimedOut,
            "Unviable" => Fate::Unviable,
            other => bail!("mutant {name}: unknown outcome `{other}`"),
        };
        parsed
            .mutants
            .push((name.to_owned(), file.to_owned(), fate));
    }
    Ok(parsed)
}

/// A mutant's name without its line and column, which move with every edit above it:
/// `consumers/src/retry.rs: replace * with +`.
fn key(name: &str) -> String {
    match name.split_once(": ") {
        Some((place, what)) => {
            let file = place.split(':').next().unwrap_or(place);
            format!("{file}: {what}")
        }
        None => name.to_owned(),
    }
}

/// The listed equivalent mutants: key → reason.
fn read_equivalent(path: &Path) -> Result<BTreeMap<String, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_equivalent(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn parse_equivalent(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut listed = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((mutant, reason)) = line.split_once(" -- ") else {
            return Err(format!(
                "line {}: `{line}` gives no reason (FILE: MUTATION -- REASON)",
                n + 1
            ));
        };
        if reason.trim().is_empty() {
            return Err(format!("line {}: the reason is empty", n + 1));
        }
        listed.insert(key(mutant.trim()), reason.trim().to_owned());
    }
    Ok(listed)
}

/// The outcomes against the list.
struct Report<'a> {
    /// Per file: caught, timed out, missed (unlisted), listed, unviable.
    files: BTreeMap<&'a str, [usize; 5]>,
    missed: Vec<&'a str>,
    stale: Vec<&'a str>,
}

impl<'a> Report<'a> {
    fn new(
        fates: &'a BTreeMap<String, (String, Fate)>,
        equivalent: &'a BTreeMap<String, String>,
    ) -> Self {
        let mut report = Report {
            files: BTreeMap::new(),
            missed: vec![],
            stale: vec![],
        };
        for (name, (file, fate)) in fates {
            let listed = equivalent.contains_key(&key(name));
            let column = match (fate, listed) {
                (Fate::Caught, _) => 0,
                (Fate::TimedOut, _) => 1,
                (Fate::Missed, false) => 2,
                (Fate::Missed, true) => 3,
                (Fate::Unviable, _) => 4,
            };
            if column == 2 {
                report.missed.push(name);
            }
            if listed && matches!(fate, Fate::Caught | Fate::TimedOut) {
                report.stale.push(name);
            }
            report.files.entry(file).or_default()[column] += 1;
        }
        report
    }

    fn totals(&self) -> [usize; 5] {
        self.files.values().fold([0; 5], |mut sum, row| {
            sum.iter_mut().zip(row).for_each(|(s, n)| *s += n);
            sum
        })
    }

    fn table(&self) -> String {
        let mut out = format!(
            "\n{:<44} {:>7} {:>9} {:>7} {:>11} {:>9}\n",
            "file", "caught", "timed out", "missed", "equivalent", "unviable"
        );
        let mut line = |file: &str, row: &[usize; 5]| {
            let _ = writeln!(
                out,
                "{file:<44} {:>7} {:>9} {:>7} {:>11} {:>9}",
                row[0], row[1], row[2], row[3], row[4]
            );
        };
        for (file, row) in &self.files {
            line(file, row);
        }
        line("total", &self.totals());
        out
    }

    /// The problems: unlisted survivors, stale entries, and (on a full run) too many listed.
    fn problems(&self, full: bool) -> Vec<String> {
        let mut problems: Vec<String> = self
            .missed
            .iter()
            .map(|name| format!("mutant survived: {name}"))
            .collect();
        problems.extend(self.stale.iter().map(|name| {
            format!("{EQUIVALENT} lists {name}, which the tests catch: remove the entry")
        }));
        let [caught, timed_out, missed, listed, _] = self.totals();
        let viable = caught + timed_out + missed + listed;
        if full && listed * 100 > viable * MAX_EQUIVALENT_PERCENT {
            problems.push(format!(
                "{listed} listed equivalent mutants are more than {MAX_EQUIVALENT_PERCENT}% of \
                 the {viable} viable ones"
            ));
        }
        problems
    }
}

/// `text` with regex metacharacters escaped, to match a mutant's name exactly.
fn escape_regex(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if r"\.+*?()|[]{}^$#&-~".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The target directory cargo builds into.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutants_key_drops_its_line_and_column() {
        assert_eq!(
            key("consumers/src/retry.rs:90:58: replace * with + in backoff"),
            "consumers/src/retry.rs: replace * with + in backoff"
        );
        assert_eq!(
            key("consumers/src/retry.rs: replace * with + in backoff"),
            "consumers/src/retry.rs: replace * with + in backoff"
        );
    }

    #[test]
    fn every_listed_mutant_needs_a_reason() {
        let listed = parse_equivalent(
            "# comment\n\nconsumers/src/worker.rs:10:5: replace f with () -- drop does it\n",
        )
        .expect("one entry");
        assert_eq!(
            listed.get("consumers/src/worker.rs: replace f with ()"),
            Some(&"drop does it".to_owned())
        );
        let e = parse_equivalent("consumers/src/worker.rs: replace f with ()\n")
            .expect_err("no reason");
        assert!(e.contains("line 1") && e.contains("no reason"), "{e}");
        assert!(parse_equivalent("a.rs: m --  \n").is_err());
    }

    #[test]
    fn outcomes_are_read_and_the_best_fate_of_a_mutant_counts() {
        let text = r#"{"outcomes": [
            {"scenario": "Baseline", "summary": "Success"},
            {"scenario": {"Mutant": {"name": "a.rs:1:1: replace x with y", "file": "a.rs"}},
             "summary": "MissedMutant"},
            {"scenario": {"Mutant": {"name": "a.rs:2:1: replace z with w", "file": "a.rs"}},
             "summary": "CaughtMutant"},
            {"scenario": {"Mutant": {"name": "b.rs:1:1: replace q with r", "file": "b.rs"}},
             "summary": "Unviable"}
        ]}"#;
        let parsed = parse_outcomes(text).expect("outcomes");
        assert!(!parsed.baseline_failed);
        assert_eq!(parsed.mutants.len(), 3);
        assert_eq!(parsed.mutants[0].2, Fate::Missed);
        assert!(Fate::Caught < Fate::Missed, "caught anywhere is caught");
        let failed =
            parse_outcomes(r#"{"outcomes": [{"scenario": "Baseline", "summary": "Failure"}]}"#)
                .expect("outcomes");
        assert!(failed.baseline_failed);
        assert!(parse_outcomes(r#"{"outcomes": [{"scenario": {"Mutant": {"name": "a", "file": "a"}}, "summary": "Odd"}]}"#).is_err());
    }

    #[test]
    fn survivors_fail_unless_listed_and_listed_ones_are_bounded() {
        let fates: BTreeMap<String, (String, Fate)> = [
            ("a.rs:1:1: m1", Fate::Missed),
            ("a.rs:2:1: m2", Fate::Missed),
            ("a.rs:3:1: m3", Fate::Caught),
            ("b.rs:1:1: m4", Fate::Caught),
            ("b.rs:2:1: m5", Fate::Unviable),
        ]
        .into_iter()
        .map(|(n, f)| (n.to_owned(), (n[..4].to_owned(), f)))
        .collect();
        let listed: BTreeMap<String, String> = [("a.rs: m2", "why"), ("b.rs: m4", "why")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let report = Report::new(&fates, &listed);
        assert_eq!(report.files["a.rs"], [1, 0, 1, 1, 0]);
        assert_eq!(report.totals(), [2, 0, 1, 1, 1]);
        let problems = report.problems(true);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("survived: a.rs:1:1: m1")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("b.rs:1:1: m4") && p.contains("remove")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("more than 3%")),
            "{problems:?}"
        );
        assert!(
            !report
                .problems(false)
                .iter()
                .any(|p| p.contains("more than")),
            "only full runs are bounded"
        );
    }

    #[test]
    fn names_are_escaped_to_match_themselves() {
        assert_eq!(
            escape_regex("a.rs:1:2: replace * with + in <impl X for Y>::f -> Vec<(i64, i64)>"),
            r"a\.rs:1:2: replace \* with \+ in <impl X for Y>::f \-> Vec<\(i64, i64\)>"
        );
    }
}

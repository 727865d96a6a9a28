//! Project automation for softcrum-jobs. `cargo xtask ci` is the one command CI runs: every
//! check in order, stopping at the first failure, with a summary that says how to re-run it.

mod adr;
mod browser;
mod conformance;
mod deps;
mod emulators;
mod modules;
mod mutants;
mod packaging;
mod services;
mod workspace;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;

const USAGE: &str = "\
Usage: cargo xtask <command>

Commands:
  ci      run every CI check in order: fmt, deps, modules, adr, packaging, services, emulators, clippy,
          schema, features, test, conformance (the vendors' Node SDKs against the fakes),
          browser (the console in Chromium), mutants (those of the last commit), doc
  schema  regenerate the committed JSON schema of jobs-core from the code
  emulators
          install the vendors' emulators the tests run (Vercel Queues) into .venv
  bench <name>
          run a benchmark (release build) next to its baseline: consume, ratelimit, vercel,
          pg-queue (JOBS_BENCH_PG_QUEUE_JOBS=10000 for a quick run, JOBS_BENCH_ROUNDS=1 for
          one round per row instead of the best of three), fairness
          (JOBS_BENCH_FAIR_BACKLOGS=10000 for a quick run), soak (a private PostgreSQL
          cluster with autovacuum on; JOBS_BENCH_SOAK_SECONDS, default 180), cleanup (the
          processed_jobs TTL cleanup; JOBS_BENCH_CLEANUP_CLAIMS=1000000 for a quick run)
  mutants [--in-diff [BASE]]
          mutation testing of the runtime and the semantics crates (pinned cargo-mutants,
          installed when missing): every mutant, or with --in-diff those of lines changed since
          BASE (default HEAD~1); survivors fail unless xtask/equivalent-mutants.txt explains them
  modules two modules of one crate, neither inside the other, that refer to each other (a CI
          step: the dependency between them must run one way)
  help    print this message
";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Task {
    Ci,
    Schema,
    Emulators,
    Bench(String),
    Mutants(mutants::Scope),
    Modules,
    Help,
    Unknown(String),
}

fn parse_args(args: &[String]) -> Task {
    match args {
        [] => Task::Help,
        [arg] => match arg.as_str() {
            "ci" => Task::Ci,
            "schema" => Task::Schema,
            "emulators" => Task::Emulators,
            "mutants" => Task::Mutants(mutants::Scope::All),
            "modules" => Task::Modules,
            "help" | "--help" | "-h" => Task::Help,
            _ => Task::Unknown(arg.clone()),
        },
        [command, name] if command == "bench" => Task::Bench(name.clone()),
        [command, flag] if command == "mutants" && flag == "--in-diff" => {
            Task::Mutants(mutants::Scope::InDiff(mutants::DEFAULT_BASE.to_owned()))
        }
        [command, flag, base] if command == "mutants" && flag == "--in-diff" => {
            Task::Mutants(mutants::Scope::InDiff(base.clone()))
        }
        _ => Task::Unknown(args.join(" ")),
    }
}

/// `cargo xtask bench NAME`: the `jobs-bench` binary's subcommand NAME, in release mode.
macro_rules! bench {
    ($name:literal) => {
        (
            $name,
            Cmd::new(&[
                "run",
                "--release",
                "--quiet",
                "-p",
                "jobs-bench",
                "--",
                $name,
            ]),
        )
    };
}

/// The benchmarks, each a subcommand of the `jobs-bench` binary.
const BENCHES: &[(&str, Cmd)] = &[
    bench!("consume"),
    bench!("ratelimit"),
    bench!("vercel"),
    bench!("pg-queue"),
    bench!("fairness"),
    bench!("soak"),
    bench!("cleanup"),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse_args(&args) {
        Task::Help => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Task::Unknown(arg) => {
            eprint!("unknown command `{arg}`\n\n{USAGE}");
            ExitCode::from(2)
        }
        Task::Schema => match run(&SCHEMA_UPDATE, &workspace_root()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        },
        Task::Ci => ci(),
        Task::Emulators => match emulators::ensure(&workspace_root()) {
            Ok(problems) if problems.is_empty() => ExitCode::SUCCESS,
            Ok(problems) => {
                problems.iter().for_each(|p| eprintln!("{p}"));
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("{e:#}");
                ExitCode::FAILURE
            }
        },
        Task::Mutants(scope) => match mutants::run(&workspace_root(), &scope) {
            Ok(problems) if problems.is_empty() => ExitCode::SUCCESS,
            Ok(problems) => {
                problems.iter().for_each(|p| eprintln!("error: {p}"));
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("{e:#}");
                ExitCode::FAILURE
            }
        },
        Task::Modules => match modules::problems(&workspace_root()) {
            Ok(problems) if problems.is_empty() => {
                println!("modules: no two modules of one crate refer to each other");
                ExitCode::SUCCESS
            }
            Ok(problems) => {
                problems.iter().for_each(|p| eprintln!("error: {p}"));
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("{e:#}");
                ExitCode::FAILURE
            }
        },
        Task::Bench(name) => match BENCHES.iter().find(|(bench, _)| *bench == name) {
            Some((_, cmd)) => match run(cmd, &workspace_root()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(()) => ExitCode::FAILURE,
            },
            None => {
                eprint!("unknown benchmark `{name}`\n\n{USAGE}");
                ExitCode::from(2)
            }
        },
    }
}

/// A cargo invocation, kept as data so the plan is testable and the re-run hint exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cmd {
    env: &'static [(&'static str, &'static str)],
    args: &'static [&'static str],
}

impl Cmd {
    const fn new(args: &'static [&'static str]) -> Self {
        Self { env: &[], args }
    }
}

/// Shell syntax a developer can paste: `RUSTDOCFLAGS='-D warnings' cargo doc ...`.
impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let quoted = |word: &str| {
            if word.contains(' ') {
                format!("'{word}'")
            } else {
                word.to_owned()
            }
        };
        for (key, value) in self.env {
            write!(f, "{key}={} ", quoted(value))?;
        }
        f.write_str("cargo")?;
        self.args
            .iter()
            .try_for_each(|arg| write!(f, " {}", quoted(arg)))
    }
}

/// `jobs-ops` with no feature: the in-process defaults only.
const FEATURES_NONE: Cmd = Cmd::new(&[
    "clippy",
    "--package",
    "jobs-ops",
    "--lib",
    "--no-default-features",
    "--",
    "-D",
    "warnings",
]);
/// `jobs-ops` with one adapter's feature, as a module binary on PostgreSQL builds it.
const FEATURES_POSTGRES: Cmd = Cmd::new(&[
    "clippy",
    "--package",
    "jobs-ops",
    "--lib",
    "--no-default-features",
    "--features",
    "postgres",
    "--",
    "-D",
    "warnings",
]);

const SCHEMA_ARGS: &[&str] = &["test", "--quiet", "-p", "jobs-core", "--test", "schema"];
const SCHEMA_CHECK: Cmd = Cmd::new(SCHEMA_ARGS);
const SCHEMA_UPDATE: Cmd = Cmd {
    env: &[("JOBS_UPDATE_SCHEMA", "1")],
    args: SCHEMA_ARGS,
};

/// A check run in-process; returns one message per problem found in the workspace at `root`.
type Check = fn(&Path) -> Result<Vec<String>>;

/// What a CI step does.
enum Action {
    /// Cargo commands run in order; the first failing one fails the step.
    Run(Vec<Cmd>),
    /// An in-process check.
    Check(Check),
}

struct Step {
    name: &'static str,
    action: Action,
}

/// The CI steps in order; `nextest` says whether `cargo nextest` is installed.
fn plan(nextest: bool) -> Vec<Step> {
    let run = |name, cmds: &[Cmd]| Step {
        name,
        action: Action::Run(cmds.to_vec()),
    };
    let check = |name, check: Check| Step {
        name,
        action: Action::Check(check),
    };
    let tests = if nextest {
        Cmd::new(&[
            "nextest",
            "run",
            "--workspace",
            "--all-features",
            "--profile",
            "ci",
        ])
    } else {
        Cmd::new(&["test", "--workspace", "--all-features"])
    };
    vec![
        run("fmt", &[Cmd::new(&["fmt", "--all", "--", "--check"])]),
        check("deps", |root| Ok(deps::violations(&workspace::load(root)?))),
        check("modules", modules::problems),
        check("adr", |root| {
            Ok(adr::violations(&workspace::load(root)?, &adr::load(root)?))
        }),
        check("packaging", |root| {
            packaging::problems(root, &workspace::load(root)?)
        }),
        check("services", |_| {
            Ok(services::problems(services::SERVICES, |key| {
                std::env::var(key).ok()
            }))
        }),
        check("emulators", emulators::ensure),
        run(
            "clippy",
            &[Cmd::new(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--all-features",
                "--",
                "-D",
                "warnings",
            ])],
        ),
        // Cheap beside the tests, so a broken doc link fails within minutes.
        run(
            "doc",
            &[Cmd {
                env: &[("RUSTDOCFLAGS", "-D warnings")],
                args: &["doc", "--workspace", "--no-deps", "--all-features"],
            }],
        ),
        run("schema", &[SCHEMA_CHECK]),
        // The library a module binary links, with no adapter and with one: each must build
        // on its own (jobsctl, with every adapter, is the workspace's clippy above).
        run("features", &[FEATURES_NONE, FEATURES_POSTGRES]),
        run(
            "test",
            &[
                tests,
                Cmd::new(&["test", "--workspace", "--all-features", "--doc"]),
            ],
        ),
        check("conformance", conformance::run),
        check("browser", browser::run),
        check("mutants", mutants::ci),
    ]
}

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Failed,
    Skipped,
}

/// One line of the summary table.
#[derive(Debug)]
struct Row {
    step: &'static str,
    outcome: Outcome,
    took: Duration,
}

/// The failed step and the command that re-runs it.
#[derive(Debug)]
struct Failure {
    step: &'static str,
    rerun: String,
}

fn summary(rows: &[Row], failure: Option<&Failure>) -> String {
    let mut out = String::from("\nstep        result   seconds\n");
    for row in rows {
        let (result, seconds) = match row.outcome {
            Outcome::Ok => ("ok", format!("{:.1}", row.took.as_secs_f64())),
            Outcome::Failed => ("FAILED", format!("{:.1}", row.took.as_secs_f64())),
            Outcome::Skipped => ("skipped", "-".to_owned()),
        };
        out += &format!("{:<11} {result:<8} {seconds:>7}\n", row.step);
    }
    let total: Duration = rows.iter().map(|row| row.took).sum();
    out += &match failure {
        Some(Failure { step, rerun }) => {
            format!("\nCI FAILED at step `{step}`. Re-run it with: {rerun}\n")
        }
        None => format!("\nCI passed in {:.1} s.\n", total.as_secs_f64()),
    };
    out
}

/// Whether `cargo nextest` is installed.
fn has_nextest() -> bool {
    Command::new(cargo())
        .args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs every step in order, stops at the first failure, prints the summary.
fn ci() -> ExitCode {
    let root = workspace_root();
    let nextest = has_nextest();
    if !nextest {
        println!("xtask: cargo-nextest is not installed; the test step uses cargo test");
    }
    let mut rows = Vec::new();
    let mut failure = None;
    for step in plan(nextest) {
        if failure.is_some() {
            rows.push(Row {
                step: step.name,
                outcome: Outcome::Skipped,
                took: Duration::ZERO,
            });
            continue;
        }
        println!("\n==> {}", step.name);
        let started = Instant::now();
        let result = execute(&step.action, &root);
        let outcome = if result.is_ok() {
            Outcome::Ok
        } else {
            Outcome::Failed
        };
        rows.push(Row {
            step: step.name,
            outcome,
            took: started.elapsed(),
        });
        if let Err(rerun) = result {
            failure = Some(Failure {
                step: step.name,
                rerun,
            });
        }
    }
    print!("{}", summary(&rows, failure.as_ref()));
    if failure.is_some() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs one step, streaming output; on failure, returns the command that re-runs it.
fn execute(action: &Action, root: &Path) -> Result<(), String> {
    match action {
        Action::Run(cmds) => cmds
            .iter()
            .try_for_each(|cmd| run(cmd, root).map_err(|()| cmd.to_string())),
        Action::Check(check) => {
            let problems = check(root).unwrap_or_else(|error| vec![format!("{error:#}")]);
            for problem in &problems {
                eprintln!("error: {problem}");
            }
            // In-process checks come right after `fmt`, so the full run reaches them quickly.
            if problems.is_empty() {
                Ok(())
            } else {
                Err("cargo xtask ci".to_owned())
            }
        }
    }
}

/// Runs `cmd` in `root` with inherited stdio; `Err` when it cannot start or exits non-zero.
fn run(cmd: &Cmd, root: &Path) -> Result<(), ()> {
    println!("$ {cmd}");
    let mut command = Command::new(cargo());
    command
        .args(cmd.args)
        .envs(cmd.env.iter().copied())
        .current_dir(root);
    if std::env::var_os("CARGO_TERM_COLOR").is_none() {
        command.env("CARGO_TERM_COLOR", "always");
    }
    match command.status() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => {
            eprintln!("xtask: `{cmd}` failed ({status})");
            Err(())
        }
        Err(error) => {
            eprintln!("xtask: cannot run `{cmd}`: {error}");
            Err(())
        }
    }
}

/// The cargo that runs us (`cargo xtask` sets `CARGO`), so the toolchain stays the same.
fn cargo() -> PathBuf {
    std::env::var_os("CARGO").map_or_else(|| "cargo".into(), PathBuf::from)
}

/// The workspace root: the folder above this crate's manifest.
fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| (*word).to_owned()).collect()
    }

    #[test]
    fn parses_commands() {
        assert_eq!(parse_args(&args(&[])), Task::Help);
        assert_eq!(parse_args(&args(&["help"])), Task::Help);
        assert_eq!(parse_args(&args(&["ci"])), Task::Ci);
        assert_eq!(parse_args(&args(&["schema"])), Task::Schema);
        assert_eq!(
            parse_args(&args(&["bench", "consume"])),
            Task::Bench("consume".into())
        );
        assert_eq!(
            parse_args(&args(&["mutants"])),
            Task::Mutants(mutants::Scope::All)
        );
        assert_eq!(
            parse_args(&args(&["mutants", "--in-diff"])),
            Task::Mutants(mutants::Scope::InDiff("HEAD~1".into()))
        );
        assert_eq!(
            parse_args(&args(&["mutants", "--in-diff", "main"])),
            Task::Mutants(mutants::Scope::InDiff("main".into()))
        );
        assert_eq!(parse_args(&args(&["modules"])), Task::Modules);
        assert_eq!(
            parse_args(&args(&["modules", "x"])),
            Task::Unknown("modules x".into())
        );
        assert_eq!(parse_args(&args(&["lint"])), Task::Unknown("lint".into()));
        assert_eq!(
            parse_args(&args(&["ci", "x"])),
            Task::Unknown("ci x".into())
        );
    }

    #[test]
    fn plan_runs_the_steps_in_order() {
        let names: Vec<_> = plan(true).iter().map(|step| step.name).collect();
        assert_eq!(
            names,
            [
                "fmt",
                "deps",
                "modules",
                "adr",
                "packaging",
                "services",
                "emulators",
                "clippy",
                "doc",
                "schema",
                "features",
                "test",
                "conformance",
                "browser",
                "mutants"
            ]
        );
    }

    fn commands(nextest: bool, step: &str) -> Vec<String> {
        let plan = plan(nextest);
        let step = plan.iter().find(|s| s.name == step).unwrap();
        match &step.action {
            Action::Run(cmds) => cmds.iter().map(Cmd::to_string).collect(),
            Action::Check(_) => panic!("{} is a check", step.name),
        }
    }

    #[test]
    fn tests_use_nextest_when_installed_and_always_run_doctests() {
        assert_eq!(
            commands(true, "test"),
            [
                "cargo nextest run --workspace --all-features --profile ci",
                "cargo test --workspace --all-features --doc",
            ]
        );
        assert_eq!(
            commands(false, "test"),
            [
                "cargo test --workspace --all-features",
                "cargo test --workspace --all-features --doc",
            ]
        );
    }

    #[test]
    fn the_library_builds_with_no_adapter_and_with_one() {
        assert_eq!(
            commands(true, "features"),
            [
                "cargo clippy --package jobs-ops --lib --no-default-features -- -D warnings",
                "cargo clippy --package jobs-ops --lib --no-default-features --features postgres \
                 -- -D warnings",
            ]
        );
    }

    #[test]
    fn commands_render_as_pasteable_shell() {
        assert_eq!(
            commands(true, "doc"),
            ["RUSTDOCFLAGS='-D warnings' cargo doc --workspace --no-deps --all-features"]
        );
        assert_eq!(
            SCHEMA_UPDATE.to_string(),
            "JOBS_UPDATE_SCHEMA=1 cargo test --quiet -p jobs-core --test schema"
        );
        assert_eq!(commands(true, "fmt"), ["cargo fmt --all -- --check"]);
    }

    #[test]
    fn summary_names_the_failed_step_and_its_command() {
        let rows = [
            Row {
                step: "fmt",
                outcome: Outcome::Ok,
                took: Duration::from_millis(1500),
            },
            Row {
                step: "clippy",
                outcome: Outcome::Failed,
                took: Duration::from_secs(12),
            },
            Row {
                step: "doc",
                outcome: Outcome::Skipped,
                took: Duration::ZERO,
            },
        ];
        let failure = Failure {
            step: "clippy",
            rerun: "cargo clippy".into(),
        };
        assert_eq!(
            summary(&rows, Some(&failure)),
            "\nstep        result   seconds\n\
             fmt         ok           1.5\n\
             clippy      FAILED      12.0\n\
             doc         skipped        -\n\
             \nCI FAILED at step `clippy`. Re-run it with: cargo clippy\n"
        );
        assert!(summary(&rows[..1], None).ends_with("\nCI passed in 1.5 s.\n"));
    }
}

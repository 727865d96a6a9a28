//! `jobsctl --help` and `jobsctl <command> --help` for every command and subcommand, compared
//! with the committed snapshots in `tests/snapshots/help/` (one file per command, `jobsctl.txt`
//! for the top level, `jobsctl.dead-letters.replay.txt` for `jobsctl dead-letters replay`).
//!
//! A change fails with a diff; `JOBS_UPDATE_SNAPSHOTS=1` writes the new output instead (and
//! removes the snapshots of commands that are gone). The binary runs with an empty
//! environment and its output piped, so neither the terminal (width, colour) nor the
//! machine's configuration shows in the text.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The variable that turns the comparison into an update.
const UPDATE: &str = "JOBS_UPDATE_SNAPSHOTS";

fn snapshots() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/help")
}

/// The long help of `jobsctl <path…>`, as an operator without a terminal would read it.
fn help(path: &[String]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_jobsctl"))
        .args(path)
        .arg("--help")
        .env_clear()
        .env("NO_COLOR", "1")
        .env("TERM", "dumb")
        .output()
        .expect("jobsctl runs");
    assert!(
        output.status.success(),
        "jobsctl {} --help failed: {}",
        path.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

/// The subcommands a help text lists under `Commands:` (`help` aside).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command's help, by snapshot file name, walking the tree from the top.
fn every_help() -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut pending = vec![Vec::<String>::new()];
    while let Some(path) = pending.pop() {
        let text = help(&path);
        for sub in subcommands(&text) {
            let mut deeper = path.clone();
            deeper.push(sub);
            pending.push(deeper);
        }
        let name = std::iter::once("jobsctl")
            .chain(path.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(".");
        found.insert(format!("{name}.txt"), text);
    }
    found
}

/// A line diff of `old` to `new`: unchanged lines indented, removed ones `-`, added ones `+`.
fn diff(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    // The longest common subsequence, by suffix.
    let mut common = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            common[i][j] = if a[i] == b[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push_str(&format!("  {}\n", a[i]));
            (i, j) = (i + 1, j + 1);
        } else if i < a.len() && (j == b.len() || common[i + 1][j] >= common[i][j + 1]) {
            out.push_str(&format!("- {}\n", a[i]));
            i += 1;
        } else {
            out.push_str(&format!("+ {}\n", b[j]));
            j += 1;
        }
    }
    out
}

#[test]
fn every_commands_help_matches_its_snapshot() {
    let dir = snapshots();
    let current = every_help();
    assert!(
        current.len() > 10,
        "the walk found too few commands: {:?}",
        current.keys()
    );
    let committed: Vec<String> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(".txt"))
                .collect()
        })
        .unwrap_or_default();
    if std::env::var_os(UPDATE).is_some() {
        std::fs::create_dir_all(&dir).expect("create the snapshot folder");
        for name in committed.iter().filter(|name| !current.contains_key(*name)) {
            std::fs::remove_file(dir.join(name)).expect("remove a stale snapshot");
        }
        for (name, text) in &current {
            std::fs::write(dir.join(name), text).expect("write a snapshot");
        }
        return;
    }
    let mut problems = Vec::new();
    for name in committed.iter().filter(|name| !current.contains_key(*name)) {
        problems.push(format!("{name}: no such command any more"));
    }
    for (name, text) in &current {
        match std::fs::read_to_string(dir.join(name)) {
            Ok(expected) if expected == *text => {}
            Ok(expected) => problems.push(format!("{name} changed:\n{}", diff(&expected, text))),
            Err(_) => problems.push(format!("{name}: no snapshot yet")),
        }
    }
    assert!(
        problems.is_empty(),
        "the help differs from tests/snapshots/help (re-run with {UPDATE}=1 to accept it):\n\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_diff_marks_removed_and_added_lines() {
    assert_eq!(
        diff("a\nb\nc\n", "a\nB\nc\nd\n"),
        "  a\n- b\n+ B\n  c\n+ d\n"
    );
}

/// `jobsctl migrate --help` names every table the migrations create, on both stores.
#[test]
fn migrate_names_every_table_it_creates() {
    let text = help(&["migrate".to_owned()]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for dir in ["adapters/postgres/migrations", "adapters/sqlite/migrations"] {
        for entry in std::fs::read_dir(root.join(dir)).expect("the migrations") {
            let sql = std::fs::read_to_string(entry.expect("an entry").path()).expect("a file");
            for line in sql.lines() {
                let Some(rest) = line.trim().strip_prefix("create table if not exists ") else {
                    continue;
                };
                let table = rest.split([' ', '(']).next().unwrap_or_default();
                let name = table.trim_start_matches("core.");
                assert!(text.contains(name), "{dir}: {table} is not named:\n{text}");
            }
        }
    }
}

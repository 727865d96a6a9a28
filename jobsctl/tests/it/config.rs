//! Configuration precedence through the real binary: flag, then environment, then `jobs.toml`,
//! then the default, shown by `jobsctl config` and obeyed by `jobsctl migrate`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A directory of its own, removed at the end: the working directory of the runs.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Dir {
        let path = std::env::temp_dir().join(format!(
            "jobsctl-config-{}-{}",
            std::process::id(),
            jobs_core::JobId::generate()
        ));
        std::fs::create_dir_all(&path).expect("create");
        Dir(path)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_jobsctl"));
    command.current_dir(dir).args(args);
    for var in [
        "DATABASE_URL",
        "JOBS_QUEUE_URL",
        "JOBS_CONFIG",
        "JOBS_ALERTER",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    command.output().expect("jobsctl runs")
}

/// `key` → (value, source) from `jobsctl config --json`.
fn shown(output: &Output, key: &str) -> (String, String) {
    assert!(output.status.success(), "{output:?}");
    let line = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON Lines"))
        .find(|v| v["key"] == key)
        .unwrap_or_else(|| panic!("{key} not shown"));
    (
        line["value"].as_str().unwrap_or("-").to_owned(),
        line["source"].as_str().expect("a source").to_owned(),
    )
}

#[test]
fn flags_beat_the_environment_which_beats_jobs_toml_which_beats_the_default() {
    let dir = Dir::new();
    std::fs::write(
        dir.0.join("jobs.toml"),
        "database_url = \"sqlite://from-file.db\"\nalerter = \"betterstack\"\n\
         [betterstack]\nrequester_email = \"oncall@example.com\"\n",
    )
    .expect("write jobs.toml");

    // jobs.toml in the working directory is read when present
    let config = run(&dir.0, &[], &["config", "--json"]);
    assert_eq!(
        shown(&config, "alerter"),
        ("betterstack".into(), "file jobs.toml".into())
    );
    assert_eq!(
        shown(&config, "queue_url"),
        ("memory:".into(), "default".into())
    );
    assert_eq!(
        shown(&config, "database_url").0,
        "sqlite://from-file.db",
        "a URL without a password is shown whole"
    );
    let with_password = run(
        &dir.0,
        &[(
            "DATABASE_URL",
            "postgres://app:s3cret@db.internal:5432/jobs",
        )],
        &["config", "--json"],
    );
    assert_eq!(
        shown(&with_password, "database_url").0,
        "postgres://app:…@db.internal:5432/jobs",
        "only the password is hidden"
    );
    let migrate = run(&dir.0, &[], &["migrate"]);
    assert!(migrate.status.success(), "{migrate:?}");
    assert!(
        dir.0.join("from-file.db").exists(),
        "the file's database_url"
    );

    // the environment beats the file
    let env = [
        ("DATABASE_URL", "sqlite://from-env.db"),
        ("JOBS_ALERTER", "console"),
    ];
    let config = run(&dir.0, &env, &["config", "--json"]);
    assert_eq!(shown(&config, "alerter"), ("console".into(), "env".into()));
    assert!(run(&dir.0, &env, &["migrate"]).status.success());
    assert!(
        dir.0.join("from-env.db").exists(),
        "the environment's DATABASE_URL"
    );

    // a flag beats both
    let flag = ["migrate", "--database-url", "sqlite://from-flag.db"];
    assert!(run(&dir.0, &env, &flag).status.success());
    assert!(
        dir.0.join("from-flag.db").exists(),
        "the flag's --database-url"
    );
    let config = run(&dir.0, &env, &["config", "--json", "--alerter", "console"]);
    assert_eq!(shown(&config, "alerter").1, "flag");

    // --config names another file, which must exist
    std::fs::write(dir.0.join("other.toml"), "queue_url = \"memory:\"\n").expect("write");
    let other = run(&dir.0, &[], &["config", "--json", "--config", "other.toml"]);
    assert_eq!(shown(&other, "queue_url").1, "file other.toml");
    assert_eq!(
        shown(&other, "alerter").1,
        "default",
        "jobs.toml is not read then"
    );
    let missing = run(&dir.0, &[], &["config", "--config", "nope.toml"]);
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    let via_env = run(&dir.0, &[("JOBS_CONFIG", "nope.toml")], &["config"]);
    assert_eq!(via_env.status.code(), Some(2), "{via_env:?}");
    // a file without end is read up to a bound and refused there
    let endless = run(&dir.0, &[], &["config", "--config", "/dev/zero"]);
    assert_eq!(endless.status.code(), Some(2), "{endless:?}");
    assert!(
        String::from_utf8_lossy(&endless.stderr).contains("not a configuration file"),
        "{endless:?}"
    );

    // a typo in jobs.toml is an error naming the key, not a silent default
    std::fs::write(dir.0.join("jobs.toml"), "queue_ulr = \"memory:\"\n").expect("write");
    let typo = run(&dir.0, &[], &["queues"]);
    assert_eq!(typo.status.code(), Some(2), "{typo:?}");
    assert!(
        String::from_utf8_lossy(&typo.stderr).contains("`queue_ulr`: unknown key"),
        "{typo:?}"
    );
}

#[test]
fn the_text_table_keeps_its_columns_aligned_whatever_the_values() {
    let dir = Dir::new();
    let long = "sqlite://a/very/long/path/to/a/database/file/that/outgrows/any/fixed/column.db";
    let table = run(&dir.0, &[("DATABASE_URL", long)], &["config"]);
    assert!(table.status.success(), "{table:?}");
    let text = String::from_utf8_lossy(&table.stdout).into_owned();
    let rows: Vec<&str> = text.lines().filter(|l| !l.starts_with('(')).collect();
    // Every row's environment column starts where the header's does.
    let at = rows[0].find("environment").expect("a header");
    for row in &rows[1..] {
        let before = &row[..row.char_indices().nth(at).map_or(row.len(), |(i, _)| i)];
        assert!(
            before.ends_with("  ")
                && row[before.len()..].starts_with(|c: char| c.is_ascii_uppercase()),
            "misaligned:\n{text}"
        );
    }
    assert!(text.contains(long), "{text}");
    // The implied queue of a PostgreSQL store says where it came from.
    let pg = run(
        &dir.0,
        &[("DATABASE_URL", "postgres://u@h/db")],
        &["config", "--json"],
    );
    assert_eq!(
        shown(&pg, "queue_url"),
        (
            "postgres-queue:".to_owned(),
            "default, as database_url is PostgreSQL".to_owned()
        )
    );
}

//! What a module binary links: no test kit or mocks in any library's normal dependencies;
//! `jobs-ops` with no feature links no adapter but the in-process one, and with one adapter's
//! feature only that adapter besides.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

use crate::workspace::Package;

/// Crates only tests and benchmarks may link.
const TEST_ONLY: &[&str] = &["proptest", "mockall", "jobs-testkit"];

/// The packages allowed to link them: the test kit itself, the benches, the automation, and
/// `jobsctl`, whose demo runs the test kit's fakes in process.
const MAY_LINK_TESTS: &[&str] = &["jobs-testkit", "jobs-bench", "xtask", "jobsctl"];

/// The in-process adapter every composition keeps (the embedded default).
const ALWAYS: &str = "jobs-adapter-memory";

/// One message per package whose normal dependencies (default features off) link a test-only
/// crate; for `jobs-ops` with no feature, one per adapter linked but the in-process one; and
/// for `jobs-ops` with only its `postgres` feature, one per other adapter linked.
pub(crate) fn problems(root: &Path, packages: &[Package]) -> Result<Vec<String>> {
    let mut found = vec![];
    for package in packages {
        if MAY_LINK_TESTS.contains(&package.name.as_str()) {
            continue;
        }
        let tree = normal_tree(root, &package.name, &[])?;
        found.extend(test_only(&package.name, "", &tree));
        if package.name == "jobs-ops" {
            found.extend(other_adapters(&tree, None));
        }
    }
    let ops = normal_tree(root, "jobs-ops", &["postgres"])?;
    found.extend(test_only("jobs-ops", " --features postgres", &ops));
    found.extend(other_adapters(&ops, Some("postgres")));
    Ok(found)
}

/// The crate names in `package`'s normal dependency tree, default features off.
fn normal_tree(root: &Path, package: &str, features: &[&str]) -> Result<Vec<String>> {
    let mut args = vec![
        "tree",
        "--quiet",
        "--edges",
        "normal",
        "--no-default-features",
        "--prefix",
        "none",
        "--format",
        "{p}",
        "--package",
        package,
    ];
    let joined = features.join(",");
    if !features.is_empty() {
        args.extend(["--features", &joined]);
    }
    let out = Command::new(crate::cargo())
        .args(&args)
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo tree")?;
    if !out.status.success() {
        bail!("cargo tree -p {package} failed");
    }
    Ok(crate_names(&String::from_utf8_lossy(&out.stdout)))
}

/// `name v1.2.3 (…)` lines to names.
fn crate_names(tree: &str) -> Vec<String> {
    let mut names: Vec<String> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

fn test_only(package: &str, features: &str, tree: &[String]) -> Vec<String> {
    tree.iter()
        .filter(|name| TEST_ONLY.contains(&name.as_str()) && name.as_str() != package)
        .map(|name| {
            format!(
                "packaging: {package} links {name} in its normal dependencies \
                 (cargo tree -e normal --no-default-features{features} -p {package}); \
                 test crates belong in dev-dependencies or behind a feature"
            )
        })
        .collect()
}

/// One message per adapter in `jobs-ops`' tree built with only the feature `enabled` (or
/// none) but that feature's adapter and the in-process one.
fn other_adapters(tree: &[String], enabled: Option<&str>) -> Vec<String> {
    let own = enabled.map(|feature| format!("jobs-adapter-{feature}"));
    let built = match enabled {
        Some(feature) => format!("with only its {feature} feature"),
        None => "with no feature".to_owned(),
    };
    tree.iter()
        .filter(|name| name.starts_with("jobs-adapter-") && *name != ALWAYS)
        .filter(|name| own.as_deref() != Some(name.as_str()))
        .map(|name| {
            format!(
                "packaging: jobs-ops {built} links {name} (cargo tree -e normal \
                 --no-default-features -p jobs-ops); an adapter must come only with its own \
                 feature"
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_up_tree_with_a_mock_and_a_stray_adapter_is_refused() {
        let tree = crate_names(
            "jobs-ops v0.1.0 (/w/ops)\nmockall v0.13.1\njobs-adapter-postgres v0.1.0 (/w)\n\
             jobs-adapter-redis v0.1.0 (/w)\njobs-adapter-memory v0.1.0 (/w)\ntokio v1.0.0\n",
        );
        let tests = test_only("jobs-ops", "", &tree);
        assert_eq!(tests.len(), 1, "{tests:?}");
        assert!(tests[0].contains("jobs-ops links mockall"), "{tests:?}");
        let adapters = other_adapters(&tree, Some("postgres"));
        assert_eq!(adapters.len(), 1, "{adapters:?}");
        assert!(
            adapters[0].contains("with only its postgres feature links jobs-adapter-redis"),
            "{adapters:?}"
        );
        let bare = other_adapters(&tree, None);
        assert_eq!(bare.len(), 2, "{bare:?}");
        assert!(
            bare.iter()
                .all(|m| m.contains("jobs-ops with no feature links")),
            "{bare:?}"
        );
        let clean = crate_names("jobs-core v0.1.0\nserde v1.0.0\n");
        assert!(test_only("jobs-core", "", &clean).is_empty());
        let testkit = crate_names("jobs-ops v0.1.0\njobs-testkit v0.1.0 (/w/testkit)\n");
        assert_eq!(test_only("jobs-ops", "", &testkit).len(), 1);
        let memory_only = crate_names("jobs-ops v0.1.0\njobs-adapter-memory v0.1.0 (/w)\n");
        assert!(other_adapters(&memory_only, None).is_empty());
    }
}

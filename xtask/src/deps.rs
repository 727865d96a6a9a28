//! The dependency rule of ADR 0001: which workspace package may depend on which.

use std::collections::HashMap;

use crate::workspace::{Kind, Package, Role};

/// The one adapter that ports-only crates may use in their tests.
const MEMORY_ADAPTER: &str = "adapters/memory";

const CORE: &str = "jobs-core depends on no workspace package";
const CORE_IO: &str = "jobs-core does no I/O, so it links no I/O crate";

/// Crates that do I/O (or run it), which the ports crate may not link.
const IO_CRATES: &[&str] = &["sqlx", "reqwest", "redis", "axum", "hyper", "tokio"];
const PORTS_ONLY: &str = "consumers, notifications and cron may depend on jobs-core ports only";
const PORTS_ONLY_TESTS: &str = "tests of consumers, notifications and cron may use only jobs-core, jobs-testkit and the memory adapter";
const ADAPTER_TO_ADAPTER: &str = "an adapter never depends on another adapter, not even in tests";
const ADAPTER: &str = "an adapter may depend on jobs-core only";
const ADAPTER_TESTS: &str = "an adapter's tests may use only jobs-core and jobs-testkit";
const TESTKIT: &str = "jobs-testkit may not depend on adapters or composition roots, so every adapter can dev-depend on it";

/// One message per forbidden edge between workspace packages, sorted; empty when the rule holds.
/// Dependencies on crates that are not workspace members are ignored.
pub(crate) fn violations(packages: &[Package]) -> Vec<String> {
    let members: HashMap<&str, &Package> = packages.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut found: Vec<String> = packages
        .iter()
        .flat_map(|from| from.deps.iter().map(move |dep| (from, dep)))
        .filter_map(|(from, dep)| {
            let to = members.get(dep.name.as_str())?;
            let reason = forbidden(from, to, dep.kind)?;
            Some(format!(
                "dependency rule: {} ({}) depends on {} ({}) [{}]: {reason}",
                from.name,
                from.shown_dir(),
                to.name,
                to.shown_dir(),
                dep.kind.label(),
            ))
        })
        .collect();
    found.extend(
        packages
            .iter()
            .filter(|p| p.role() == Role::Core)
            .flat_map(|core| core.deps.iter().map(move |dep| (core, dep)))
            .filter(|(_, dep)| dep.kind != Kind::Dev && IO_CRATES.contains(&dep.name.as_str()))
            .map(|(core, dep)| {
                format!(
                    "dependency rule: {} ({}) depends on {} [{}]: {CORE_IO}",
                    core.name,
                    core.shown_dir(),
                    dep.name,
                    dep.kind.label(),
                )
            }),
    );
    found.sort();
    found.dedup();
    found
}

/// Why the edge `from -> to` of this kind breaks the rule, or `None` when it is allowed.
fn forbidden(from: &Package, to: &Package, kind: Kind) -> Option<&'static str> {
    let runtime = kind != Kind::Dev;
    let target = to.role();
    let test_double = matches!(target, Role::Core | Role::Testkit) || to.dir == MEMORY_ADAPTER;
    match from.role() {
        Role::Core => runtime.then_some(CORE),
        Role::PortsOnly if runtime => (target != Role::Core).then_some(PORTS_ONLY),
        Role::PortsOnly => (!test_double).then_some(PORTS_ONLY_TESTS),
        Role::Adapter if target == Role::Adapter => Some(ADAPTER_TO_ADAPTER),
        Role::Adapter if runtime => (target != Role::Core).then_some(ADAPTER),
        Role::Adapter => (!matches!(target, Role::Core | Role::Testkit)).then_some(ADAPTER_TESTS),
        Role::Testkit => {
            (runtime && matches!(target, Role::Adapter | Role::Composer)).then_some(TESTKIT)
        }
        Role::Composer => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::workspace;

    /// Synthetic `cargo metadata` output: every member of the real layout, plus `extra`
    /// dependencies given as `(from, to, kind)` with `kind` `null`, `"dev"` or `"build"`.
    fn metadata(extra: &[(&str, &str, Value)]) -> Value {
        let members = [
            ("jobs-core", "core", vec![]),
            (
                "jobs-adapter-memory",
                "adapters/memory",
                vec![("jobs-core", json!(null))],
            ),
            (
                "jobs-adapter-postgres",
                "adapters/postgres",
                vec![("jobs-core", json!(null))],
            ),
            (
                "jobs-consumers",
                "consumers",
                vec![("jobs-core", json!(null))],
            ),
            ("jobs-testkit", "testkit", vec![("jobs-core", json!(null))]),
            ("jobs-ops", "ops", vec![("jobs-core", json!(null))]),
            ("xtask", "xtask", vec![]),
        ];
        let packages: Vec<Value> = members
            .iter()
            .map(|(name, dir, deps)| {
                let mut deps: Vec<Value> = deps
                    .iter()
                    .map(|(to, kind)| json!({ "name": to, "kind": kind }))
                    .chain([json!({ "name": "serde", "kind": null })])
                    .collect();
                deps.extend(
                    extra
                        .iter()
                        .filter(|(from, ..)| from == name)
                        .map(|(_, to, kind)| json!({ "name": to, "kind": kind })),
                );
                json!({
                    "name": name,
                    "manifest_path": format!("/ws/{dir}/Cargo.toml"),
                    "dependencies": deps,
                    "targets": [],
                })
            })
            .collect();
        json!({ "workspace_root": "/ws", "packages": packages })
    }

    fn check(extra: &[(&str, &str, Value)]) -> Vec<String> {
        violations(&workspace::parse(&metadata(extra)).unwrap())
    }

    #[test]
    fn clean_workspace_has_no_violations() {
        assert_eq!(check(&[]), Vec::<String>::new());
    }

    #[test]
    fn an_io_crate_in_the_cores_normal_dependencies_is_refused() {
        assert_eq!(
            check(&[("jobs-core", "sqlx", json!(null))]),
            [
                "dependency rule: jobs-core (core/) depends on sqlx [normal]: jobs-core does no \
              I/O, so it links no I/O crate"
            ]
        );
        assert_eq!(
            check(&[("jobs-core", "tokio", json!("dev"))]),
            Vec::<String>::new(),
            "its tests may run on tokio"
        );
        assert_eq!(
            check(&[("jobs-consumers", "tokio", json!(null))]),
            Vec::<String>::new(),
            "the runtime crates may"
        );
    }

    #[test]
    fn ports_only_normal_dep_on_an_adapter_is_named() {
        assert_eq!(
            check(&[("jobs-consumers", "jobs-adapter-memory", json!(null))]),
            [
                "dependency rule: jobs-consumers (consumers/) depends on jobs-adapter-memory \
              (adapters/memory/) [normal]: consumers, notifications and cron may depend on \
              jobs-core ports only"
            ]
        );
    }

    #[test]
    fn ports_only_tests_may_use_memory_adapter_and_testkit_only() {
        assert!(check(&[("jobs-consumers", "jobs-adapter-memory", json!("dev"))]).is_empty());
        assert!(check(&[("jobs-consumers", "jobs-testkit", json!("dev"))]).is_empty());
        let other_adapter = check(&[("jobs-consumers", "jobs-adapter-postgres", json!("dev"))]);
        assert_eq!(other_adapter.len(), 1);
        assert!(other_adapter[0].ends_with(PORTS_ONLY_TESTS));
    }

    #[test]
    fn adapters_never_depend_on_each_other() {
        let found = check(&[("jobs-adapter-postgres", "jobs-adapter-memory", json!("dev"))]);
        assert_eq!(found.len(), 1);
        assert!(found[0].contains("[dev]: an adapter never depends on another adapter"));
    }

    #[test]
    fn adapter_tests_may_use_testkit() {
        assert!(check(&[("jobs-adapter-postgres", "jobs-testkit", json!("dev"))]).is_empty());
        let normal = check(&[("jobs-adapter-postgres", "jobs-testkit", json!(null))]);
        assert!(normal[0].ends_with(ADAPTER));
    }

    #[test]
    fn core_depends_on_no_workspace_package() {
        for (to, kind) in [("jobs-testkit", json!(null)), ("jobs-ops", json!("build"))] {
            let found = check(&[("jobs-core", to, kind)]);
            assert_eq!(found.len(), 1, "{to}");
            assert!(found[0].ends_with(CORE));
        }
    }

    #[test]
    fn testkit_depends_on_no_adapter() {
        let found = check(&[("jobs-testkit", "jobs-adapter-memory", json!(null))]);
        assert_eq!(found.len(), 1);
        assert!(found[0].starts_with("dependency rule: jobs-testkit (testkit/) depends on"));
        assert!(found[0].ends_with(TESTKIT));
    }

    #[test]
    fn composers_may_depend_on_everything() {
        let everything: Vec<_> = [
            "jobs-adapter-memory",
            "jobs-adapter-postgres",
            "jobs-consumers",
        ]
        .into_iter()
        .flat_map(|to| [("jobs-ops", to, json!(null)), ("xtask", to, json!("dev"))])
        .collect();
        assert!(check(&everything).is_empty());
    }

    /// Passes once the real workspace's manifests parse; `cargo metadata` needs no compilation.
    #[test]
    fn real_workspace_follows_the_rule() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap();
        let packages = workspace::load(root).unwrap();
        assert!(packages.iter().any(|p| p.name == "jobs-core"));
        assert_eq!(violations(&packages), Vec::<String>::new());
    }
}

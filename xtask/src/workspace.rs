//! The workspace's packages as `cargo metadata` reports them, and the role each one plays.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

/// What a package may depend on follows from the folder it lives in (ADR 0001).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// `core/`: the ports and types; depends on no workspace package.
    Core,
    /// `adapters/<engine>/`: one vendor or engine behind the core ports.
    Adapter,
    /// `consumers/`, `notifications/`, `cron/`: behaviour written against the core ports only.
    PortsOnly,
    /// `testkit/`: contract suites and fakes that every adapter can dev-depend on.
    Testkit,
    /// Anything else (`ops/`, `xtask/`): composition roots, unrestricted.
    Composer,
}

impl Role {
    /// The role of a package whose manifest folder is `dir`, relative to the workspace root and
    /// `/`-separated (`adapters/memory`).
    pub(crate) fn of(dir: &str) -> Self {
        match dir.split('/').collect::<Vec<_>>().as_slice() {
            ["core"] => Self::Core,
            ["adapters", _, ..] => Self::Adapter,
            ["consumers" | "notifications" | "cron"] => Self::PortsOnly,
            ["testkit"] => Self::Testkit,
            _ => Self::Composer,
        }
    }
}

/// The section of `Cargo.toml` a dependency is declared in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `[dependencies]`
    Normal,
    /// `[dev-dependencies]`
    Dev,
    /// `[build-dependencies]`
    Build,
}

impl Kind {
    /// The label used in messages, as in `[normal]`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Dev => "dev",
            Self::Build => "build",
        }
    }
}

/// A declared dependency: the depended-on package's name (not its rename) and section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Dep {
    /// The package name, e.g. `jobs-core`.
    pub(crate) name: String,
    /// Which section declares it.
    pub(crate) kind: Kind,
}

/// What a target builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TargetKind {
    /// A library of any crate type (`lib`, `rlib`, `proc-macro`, ...).
    Lib,
    /// A binary.
    Bin,
    /// A test, benchmark, example or build script.
    Other,
}

/// A target of a package: a crate with its own root file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// The target name, e.g. `jobs_ops` or `jobs-fakes`.
    pub(crate) name: String,
    /// What it builds.
    pub(crate) kind: TargetKind,
    /// Its root file relative to the workspace root, `/`-separated (`ops/src/main.rs`).
    pub(crate) src: String,
}

/// A workspace member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Package {
    /// The package name, e.g. `jobs-adapter-memory`.
    pub(crate) name: String,
    /// The manifest folder relative to the workspace root, `/`-separated (`adapters/memory`).
    pub(crate) dir: String,
    /// Every declared dependency, third-party ones included.
    pub(crate) deps: Vec<Dep>,
    /// Every target, tests and examples included.
    pub(crate) targets: Vec<Target>,
}

impl Package {
    /// The role its folder gives it.
    pub(crate) fn role(&self) -> Role {
        Role::of(&self.dir)
    }

    /// The folder as shown in messages: `adapters/memory/`.
    pub(crate) fn shown_dir(&self) -> String {
        if self.dir.is_empty() {
            "./".to_owned()
        } else {
            format!("{}/", self.dir)
        }
    }
}

/// The workspace members described by `cargo metadata --format-version 1 --no-deps` output
/// (with `--no-deps`, `packages` holds exactly the members).
pub(crate) fn parse(metadata: &Value) -> Result<Vec<Package>> {
    let root = Path::new(field(metadata, "workspace_root")?);
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata has no `packages` array")?;
    packages
        .iter()
        .map(|package| {
            let name = field(package, "name")?;
            let manifest = Path::new(field(package, "manifest_path")?);
            let dir = manifest
                .parent()
                .and_then(|dir| dir.strip_prefix(root).ok())
                .with_context(|| format!("{name}: manifest {manifest:?} is outside {root:?}"))?;
            let dir = slashed(dir);
            let deps = package["dependencies"]
                .as_array()
                .with_context(|| format!("{name}: no `dependencies` array"))?
                .iter()
                .map(|dep| {
                    let kind = match &dep["kind"] {
                        Value::Null => Kind::Normal,
                        Value::String(kind) if kind == "dev" => Kind::Dev,
                        Value::String(kind) if kind == "build" => Kind::Build,
                        other => bail!("{name}: unknown dependency kind {other}"),
                    };
                    Ok(Dep {
                        name: field(dep, "name")?.to_owned(),
                        kind,
                    })
                })
                .collect::<Result<_>>()?;
            let targets = package["targets"]
                .as_array()
                .with_context(|| format!("{name}: no `targets` array"))?
                .iter()
                .map(|target| target_of(name, root, target))
                .collect::<Result<_>>()?;
            Ok(Package {
                name: name.to_owned(),
                dir,
                deps,
                targets,
            })
        })
        .collect()
}

fn target_of(package: &str, root: &Path, target: &Value) -> Result<Target> {
    let kinds = target["kind"]
        .as_array()
        .with_context(|| format!("{package}: a target has no `kind` array"))?;
    let has = |wanted: &str| kinds.iter().any(|kind| kind.as_str() == Some(wanted));
    let kind = if has("bin") {
        TargetKind::Bin
    } else if ["test", "bench", "example", "custom-build"]
        .iter()
        .any(|other| has(other))
    {
        TargetKind::Other
    } else {
        TargetKind::Lib
    };
    let src = Path::new(field(target, "src_path")?);
    let relative = src
        .strip_prefix(root)
        .with_context(|| format!("{package}: target source {src:?} is outside {root:?}"))?;
    Ok(Target {
        name: field(target, "name")?.to_owned(),
        kind,
        src: slashed(relative),
    })
}

/// `path` with `/` between its parts, whatever the platform's separator.
fn slashed(path: &Path) -> String {
    path.components()
        .map(|part| part.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// Runs `cargo metadata` in `root` and parses its members; needs no compilation.
pub(crate) fn load(root: &Path) -> Result<Vec<Package>> {
    let output = Command::new(crate::cargo())
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .context("run cargo metadata")?;
    if !output.status.success() {
        bail!("cargo metadata failed ({})", output.status);
    }
    parse(&serde_json::from_slice(&output.stdout).context("parse cargo metadata output")?)
}

fn field<'a>(value: &'a Value, key: &str) -> Result<&'a str> {
    value[key]
        .as_str()
        .with_context(|| format!("cargo metadata: missing string `{key}`"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn roles_follow_folders() {
        assert_eq!(Role::of("core"), Role::Core);
        assert_eq!(Role::of("adapters/memory"), Role::Adapter);
        assert_eq!(Role::of("consumers"), Role::PortsOnly);
        assert_eq!(Role::of("notifications"), Role::PortsOnly);
        assert_eq!(Role::of("cron"), Role::PortsOnly);
        assert_eq!(Role::of("testkit"), Role::Testkit);
        assert_eq!(Role::of("ops"), Role::Composer);
        assert_eq!(Role::of("xtask"), Role::Composer);
        assert_eq!(Role::of("adapters"), Role::Composer);
    }

    #[test]
    fn parses_members_with_relative_dirs_and_kinds() {
        let metadata = json!({
            "workspace_root": "/ws",
            "packages": [{
                "name": "jobs-adapter-memory",
                "manifest_path": "/ws/adapters/memory/Cargo.toml",
                "dependencies": [
                    { "name": "jobs-core", "kind": null, "path": "/ws/core" },
                    { "name": "jobs-testkit", "kind": "dev", "path": "/ws/testkit" },
                    { "name": "cc", "kind": "build" },
                ],
                "targets": [
                    { "name": "jobs_adapter_memory", "kind": ["lib"],
                      "src_path": "/ws/adapters/memory/src/lib.rs" },
                    { "name": "queue", "kind": ["test"],
                      "src_path": "/ws/adapters/memory/tests/queue.rs" },
                    { "name": "fakes", "kind": ["bin"],
                      "src_path": "/ws/adapters/memory/src/bin/fakes.rs" },
                ],
            }],
        });
        let packages = parse(&metadata).unwrap();
        assert_eq!(packages.len(), 1);
        assert_eq!(packages[0].dir, "adapters/memory");
        assert_eq!(packages[0].shown_dir(), "adapters/memory/");
        let kinds: Vec<_> = packages[0].deps.iter().map(|dep| dep.kind).collect();
        assert_eq!(kinds, [Kind::Normal, Kind::Dev, Kind::Build]);
        let targets: Vec<_> = packages[0]
            .targets
            .iter()
            .map(|target| (target.kind, target.src.as_str()))
            .collect();
        assert_eq!(
            targets,
            [
                (TargetKind::Lib, "adapters/memory/src/lib.rs"),
                (TargetKind::Other, "adapters/memory/tests/queue.rs"),
                (TargetKind::Bin, "adapters/memory/src/bin/fakes.rs"),
            ]
        );
    }
}

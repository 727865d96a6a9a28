//! The ADR rule: every adapter crate is named by an Accepted ADR in `docs/adr/`, because the
//! standard asks for an ADR before a vendor's first import.

use std::io::ErrorKind;
use std::path::Path;

use anyhow::{Context as _, Result};

use crate::workspace::{Package, Role};

/// One ADR file: its file name (`0003-in-memory-adapter.md`) and its text.
#[derive(Clone, Debug)]
pub(crate) struct Adr {
    /// The file name inside `docs/adr/`.
    pub(crate) file: String,
    /// The whole Markdown text.
    pub(crate) text: String,
}

/// The ADRs in `root/docs/adr/*.md`, by file name, without templates (`template*`).
/// A missing folder means no ADRs.
pub(crate) fn load(root: &Path) -> Result<Vec<Adr>> {
    let dir = root.join("docs/adr");
    let entries = match std::fs::read_dir(&dir) {
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        entries => entries.with_context(|| format!("read {}", dir.display()))?,
    };
    let mut adrs = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("read {}", dir.display()))?
            .path();
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if !file.ends_with(".md") || file.starts_with("template") {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        adrs.push(Adr { file, text });
    }
    adrs.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(adrs)
}

/// One message per adapter package that no Accepted ADR names; empty when the rule holds.
pub(crate) fn violations(packages: &[Package], adrs: &[Adr]) -> Vec<String> {
    packages
        .iter()
        .filter(|package| package.role() == Role::Adapter)
        .filter_map(|package| {
            let naming: Vec<(&Adr, Option<String>)> = adrs
                .iter()
                .filter(|adr| names(&adr.text, &package.name))
                .map(|adr| (adr, status(&adr.text)))
                .collect();
            if naming
                .iter()
                .any(|(_, status)| status.as_deref().is_some_and(accepted))
            {
                return None;
            }
            let fix = format!(
                "add an ADR under docs/adr/ naming {} with Status: Accepted; \
                 the standard asks for an ADR before a vendor's first import",
                package.name
            );
            let what = format!("ADR rule: {} ({})", package.name, package.shown_dir());
            if naming.is_empty() {
                return Some(format!("{what} is named by no ADR: {fix}"));
            }
            let unaccepted: Vec<String> = naming
                .iter()
                .map(|(adr, status)| {
                    let status = status.as_deref().unwrap_or("no status line");
                    format!("docs/adr/{} (status: {status})", adr.file)
                })
                .collect();
            Some(format!(
                "{what} is named only by ADRs that are not Accepted: {}; accept it, or {fix}",
                unaccepted.join(", ")
            ))
        })
        .collect()
}

/// Whether `text` mentions `package` as a whole name, so `jobs-adapter-sql` is not found
/// inside `jobs-adapter-sqlite`.
fn names(text: &str, package: &str) -> bool {
    let part_of_name = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || "-_".contains(c));
    text.match_indices(package).any(|(at, _)| {
        !part_of_name(text[..at].chars().next_back())
            && !part_of_name(text[at + package.len()..].chars().next())
    })
}

/// Whether a status value counts: `Accepted`, optionally followed by e.g. a date.
fn accepted(status: &str) -> bool {
    status
        .get(..8)
        .is_some_and(|word| word.eq_ignore_ascii_case("accepted"))
}

/// The first status an ADR declares, either on a `Status: <value>` line (list bullets, bold and
/// heading marks allowed: `- Status: Accepted`, `**Status:** Accepted`) or as the first
/// non-blank line after a `## Status` heading.
fn status(text: &str) -> Option<String> {
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let heading = line.trim_start().starts_with('#');
        let line = undecorated(line);
        let Some(rest) = line
            .get(..6)
            .filter(|label| label.eq_ignore_ascii_case("status"))
        else {
            continue;
        };
        let rest = line[rest.len()..].trim_start();
        if let Some(value) = rest.strip_prefix(':') {
            return Some(value.trim().to_owned());
        }
        if heading && rest.is_empty() {
            return lines.map(undecorated).find(|line| !line.is_empty());
        }
    }
    None
}

/// A Markdown line without emphasis marks, list bullets, quote or heading marks.
fn undecorated(line: &str) -> String {
    line.replace(['*', '_'], "")
        .trim()
        .trim_start_matches(['-', '+', '>', '#', ' ', '\t'])
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(name: &str, dir: &str) -> Package {
        Package {
            name: name.to_owned(),
            dir: dir.to_owned(),
            deps: Vec::new(),
            targets: Vec::new(),
        }
    }

    fn adr(file: &str, text: &str) -> Adr {
        Adr {
            file: file.to_owned(),
            text: text.to_owned(),
        }
    }

    fn workspace() -> Vec<Package> {
        vec![
            adapter("jobs-core", "core"),
            adapter("jobs-adapter-x", "adapters/x"),
        ]
    }

    #[test]
    fn accepted_adr_naming_the_adapter_satisfies_the_rule() {
        let adrs = [adr(
            "0004-x.md",
            "# 0004. Use X\n\n- Status: Accepted\n- Crates: `jobs-adapter-x`\n",
        )];
        assert!(violations(&workspace(), &adrs).is_empty());
    }

    #[test]
    fn a_proposed_adr_alone_is_a_violation_naming_the_file() {
        let adrs = [adr(
            "0004-x.md",
            "Status: Proposed\n\nUses jobs-adapter-x.\n",
        )];
        let found = violations(&workspace(), &adrs);
        assert_eq!(found.len(), 1);
        assert!(found[0].starts_with("ADR rule: jobs-adapter-x (adapters/x/) is named only by"));
        assert!(found[0].contains("docs/adr/0004-x.md (status: Proposed)"));
    }

    #[test]
    fn no_adr_is_a_violation_saying_what_to_do() {
        let adrs = [adr(
            "0001-other.md",
            "Status: Accepted\n\njobs-adapter-xy only.\n",
        )];
        assert_eq!(
            violations(&workspace(), &adrs),
            [
                "ADR rule: jobs-adapter-x (adapters/x/) is named by no ADR: add an ADR under \
              docs/adr/ naming jobs-adapter-x with Status: Accepted; the standard asks for an \
              ADR before a vendor's first import"
            ]
        );
    }

    #[test]
    fn status_lines_in_every_decoration() {
        for line in [
            "Status: Accepted",
            "status: accepted",
            "- Status: Accepted",
            "**Status:** Accepted",
            "* **Status**: Accepted",
            "Status: Accepted (2026-11-30)",
        ] {
            let status = status(&format!("# Title\n\n{line}\n\n## Context\n"));
            assert!(
                status.as_deref().is_some_and(accepted),
                "{line}: {status:?}"
            );
        }
        assert_eq!(
            status("- Status: Superseded by 0007\n").as_deref(),
            Some("Superseded by 0007")
        );
    }

    #[test]
    fn status_heading_takes_the_next_non_blank_line() {
        let text = "# 0005. Title\n\n## Status\n\nAccepted on 2026-11-30\n\n## Context\n";
        assert_eq!(status(text).as_deref(), Some("Accepted on 2026-11-30"));
        let text = "## Status\n\nDeprecated\n";
        assert!(!accepted(&status(text).unwrap()));
        assert_eq!(status("# Title\n\nNo status here.\n"), None);
    }

    #[test]
    fn only_non_accepted_statuses_fail() {
        for value in ["Proposed", "Superseded by 0009", "Deprecated", "Rejected"] {
            let adrs = [adr(
                "0004-x.md",
                &format!("Status: {value}\njobs-adapter-x\n"),
            )];
            assert_eq!(violations(&workspace(), &adrs).len(), 1, "{value}");
        }
    }

    #[test]
    fn templates_are_ignored() {
        let root = std::env::temp_dir().join(format!("xtask-adr-{}", std::process::id()));
        let dir = root.join("docs/adr");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("template.md"),
            "Status: Accepted\njobs-adapter-x\n",
        )
        .unwrap();
        std::fs::write(dir.join("0001-a.md"), "Status: Accepted\n").unwrap();
        std::fs::write(dir.join("notes.txt"), "Status: Accepted\njobs-adapter-x\n").unwrap();
        let adrs = load(&root).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        let files: Vec<_> = adrs.iter().map(|adr| adr.file.as_str()).collect();
        assert_eq!(files, ["0001-a.md"]);
        assert_eq!(violations(&workspace(), &adrs).len(), 1);
    }

    #[test]
    fn names_match_whole_package_names_only() {
        assert!(names("Crates: `jobs-adapter-x`.", "jobs-adapter-x"));
        assert!(names("jobs-adapter-x", "jobs-adapter-x"));
        assert!(!names("jobs-adapter-xy", "jobs-adapter-x"));
        assert!(!names("my-jobs-adapter-x", "jobs-adapter-x"));
    }
}

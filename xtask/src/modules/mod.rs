//! No two modules of one crate, neither an ancestor of the other, refer to each other (tests
//! excluded): such a pair is one piece of code in two files, and neither can change alone.
//!
//! Definitions:
//!
//! - **The crates** are the library and binary targets of the workspace members. Each one's
//!   module tree is read from its root file by following `mod x;` declarations (`x.rs`,
//!   `x/mod.rs`, or the file a `#[path = "..."]` attribute names) and inline `mod x { ... }`
//!   blocks. Modules gated by a `cfg` that is false without `test` (`#[cfg(test)]`,
//!   `#![cfg(test)]`), modules named `tests`, and files under the package's `tests/`,
//!   `benches/` and `examples/` folders are left out.
//! - **Module M refers to module N** when M's own code (its file or inline block, without its
//!   child modules and without the items, statements and fields gated by `#[cfg(test)]`)
//!   names a path into N: in `use` trees (groups such as `use crate::{a::X, b::{Y, Z}}`
//!   included) and in paths anywhere else (types, expressions, attributes, macro input). A
//!   path starts at `crate::`, `super::` (as many as it has), `self::`, a module brought in by
//!   `use`, or a child module's name; paths into other crates are not followed. A path into a
//!   module refers to it and to each of its ancestors below the crate root:
//!   `crate::worker::triage::Salvage` refers to `worker::triage` and to `worker`. A path
//!   through an item the crate root imports or re-exports (`crate::PgQueue` where the root has
//!   `pub use queue::PgQueue`) is followed to where that item comes from, so moving an
//!   import to the root does not hide a pair.
//! - **Aggregated over subtrees**: A refers to B when any module inside A (A or a descendant)
//!   refers to B or a descendant of B.
//! - **A pair** {A, B} is reported when A refers to B and B refers to A, neither is the crate
//!   root and neither is an ancestor of the other; so a root re-exporting its children, a
//!   parent using its children and children using their parent never count. It is reported
//!   only at the highest level where it occurs: with `worker` and `group` reported,
//!   `worker::x` and `group::y` are not. The message names what each side takes from the
//!   other (the path below the other module, up to the first item), which is where to cut.
//!
//! Rust is read by a small hand-written lexer (comments, doc comments, strings, raw strings,
//! characters and lifetimes are told apart, so no path in a comment or a string counts) and a
//! scanner over its token trees, rather than a full parser such as `syn`: only `mod` items,
//! attributes, `use` trees and `::`-separated paths matter here, and those have a small,
//! stable syntax. It does not expand macros, so a path a macro builds from pieces is not seen.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow};

use crate::workspace::{self, Package, TargetKind};

mod lex;

use lex::{Tok, Tree, group_at, ident_at, lex, path_attribute, path_sep_at, punct_at, strip_tests};

/// One message per pair of modules that refer to each other, in every library and binary of
/// the workspace at `root`.
pub(crate) fn problems(root: &Path) -> Result<Vec<String>> {
    check(root, &workspace::load(root)?)
}

/// [`problems`] for the given packages of the workspace at `root`.
fn check(root: &Path, packages: &[Package]) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for package in packages {
        for target in &package.targets {
            let label = match target.kind {
                TargetKind::Lib => package.name.clone(),
                TargetKind::Bin => format!("{} (bin {})", package.name, target.name),
                TargetKind::Other => continue,
            };
            let tree = Crate::load(root, &package.dir, &target.src)?;
            found.extend(
                tree.missing
                    .iter()
                    .map(|missing| format!("{label}: {missing}")),
            );
            found.extend(
                pairs(&tree)
                    .into_iter()
                    .map(|pair| format!("{label}: {pair}")),
            );
        }
    }
    Ok(found)
}

/// A module's path below the crate root; the root is empty.
type ModPath = Vec<String>;

fn shown(path: &[String]) -> String {
    path.join("::")
}

// ---------------------------------------------------------------------------------------------
// The module tree

/// The modules of one crate and the code each one holds itself.
struct Crate {
    /// Every module, the root (empty path) included, with its own code: no child module, no
    /// `#[cfg(test)]` part.
    modules: BTreeMap<ModPath, Vec<Tree>>,
    /// One message per `mod x;` whose file is missing.
    missing: Vec<String>,
}

/// Where a module's `mod x;` children are looked for.
struct Scope {
    path: ModPath,
    /// The folder of `x.rs` and `x/mod.rs`.
    children: PathBuf,
    /// The folder a `#[path]` attribute is relative to.
    path_base: PathBuf,
}

struct Loader<'a> {
    /// The workspace root, to show paths relative to it.
    root: &'a Path,
    /// The package folder, for its `tests/`, `benches/` and `examples/`.
    package: PathBuf,
    seen: HashSet<PathBuf>,
    tree: Crate,
}

impl Crate {
    /// The module tree of the crate whose root file is `src`, in the package at `dir`; both
    /// are relative to the workspace `root`.
    fn load(root: &Path, dir: &str, src: &str) -> Result<Self> {
        let mut loader = Loader {
            root,
            package: root.join(dir),
            seen: HashSet::new(),
            tree: Crate {
                modules: BTreeMap::new(),
                missing: Vec::new(),
            },
        };
        loader.file(&root.join(src), Vec::new(), true)?;
        Ok(loader.tree)
    }

    fn is_module(&self, path: &[String]) -> bool {
        self.modules.contains_key(path)
    }
}

impl Loader<'_> {
    fn shown(&self, file: &Path) -> String {
        file.strip_prefix(self.root)
            .unwrap_or(file)
            .display()
            .to_string()
    }

    /// Reads the module at `path` from `file`; `mod_rs` when its children live next to it
    /// (a crate root, a `mod.rs`, a `#[path]` file) rather than in a folder of its name.
    fn file(&mut self, file: &Path, path: ModPath, mod_rs: bool) -> Result<()> {
        let test_folders = ["tests", "benches", "examples"];
        let under_tests = file.strip_prefix(&self.package).is_ok_and(|relative| {
            relative
                .components()
                .next()
                .is_some_and(|first| test_folders.iter().any(|test| first.as_os_str() == *test))
        });
        if under_tests || !self.seen.insert(file.to_path_buf()) {
            return Ok(());
        }
        let src =
            std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
        let trees = lex(&src).map_err(|error| anyhow!("{}: {error}", self.shown(file)))?;
        let Some(trees) = strip_tests(&trees) else {
            return Ok(());
        };
        let folder = file.parent().unwrap_or(Path::new("")).to_path_buf();
        let children = if mod_rs {
            folder.clone()
        } else {
            folder.join(file.file_stem().unwrap_or_default())
        };
        let scope = Scope {
            path,
            children,
            path_base: folder,
        };
        self.module(&trees, &scope, file)
    }

    /// Records the module of `scope` with the code in `trees`, and its children.
    fn module(&mut self, trees: &[Tree], scope: &Scope, file: &Path) -> Result<()> {
        let mut code = Vec::with_capacity(trees.len());
        let mut i = 0;
        while i < trees.len() {
            let declared = (ident_at(trees, i) == Some("mod"))
                .then(|| ident_at(trees, i + 1))
                .flatten();
            let body = group_at(trees, i + 2, '{');
            let (Some(name), true) = (declared, body.is_some() || punct_at(trees, i + 2, ';'))
            else {
                code.push(trees[i].clone());
                i += 1;
                continue;
            };
            i += 3;
            if name == "tests" {
                continue;
            }
            let mut path = scope.path.clone();
            path.push(name.to_owned());
            if let Some(body) = body {
                let children = scope.children.join(name);
                let inline = Scope {
                    path,
                    children: children.clone(),
                    path_base: children,
                };
                self.module(body, &inline, file)?;
                continue;
            }
            let (candidates, mod_rs) = match path_before(trees, i - 3) {
                Some(relative) => (vec![lexical(&scope.path_base.join(relative))], true),
                None => (
                    vec![
                        scope.children.join(format!("{name}.rs")),
                        scope.children.join(name).join("mod.rs"),
                    ],
                    false,
                ),
            };
            match candidates.iter().find(|candidate| candidate.is_file()) {
                Some(found) => {
                    let mod_rs = mod_rs || found.ends_with("mod.rs");
                    self.file(found, path, mod_rs)?;
                }
                None => {
                    let tried: Vec<_> = candidates.iter().map(|c| self.shown(c)).collect();
                    let message = format!(
                        "{} declares `mod {name};` but there is no {}",
                        self.shown(file),
                        tried.join(" nor ")
                    );
                    self.tree.missing.push(message);
                }
            }
        }
        self.tree.modules.insert(scope.path.clone(), code);
        Ok(())
    }
}

/// `path` with its `.` and `..` parts resolved without the file system.
fn lexical(path: &Path) -> PathBuf {
    let mut resolved = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir if resolved.file_name().is_some() => {
                resolved.pop();
            }
            part => resolved.push(part),
        }
    }
    resolved
}

/// The `#[path = "..."]` among the attributes before the `mod` at `i` (past its visibility).
fn path_before(trees: &[Tree], i: usize) -> Option<&str> {
    let mut k = i;
    if k >= 2 && group_at(trees, k - 1, '(').is_some() && ident_at(trees, k - 2) == Some("pub") {
        k -= 2;
    } else if k >= 1 && ident_at(trees, k - 1) == Some("pub") {
        k -= 1;
    }
    while k >= 2 && punct_at(trees, k - 2, '#') {
        let attribute = group_at(trees, k - 1, '[')?;
        if let Some(file) = path_attribute(attribute) {
            return Some(file);
        }
        k -= 2;
    }
    None
}

// ---------------------------------------------------------------------------------------------
// References

/// What a module's code names: the leaves of its `use` trees with the name each binds, and
/// every other `a::b::c` path, each as written.
#[derive(Default)]
struct Named {
    uses: Vec<(Vec<String>, Option<String>)>,
    paths: Vec<Vec<String>>,
}

/// Collects the `use` leaves and other paths in `trees`, at every depth.
fn named(trees: &[Tree], out: &mut Named) {
    let mut i = 0;
    while i < trees.len() {
        if ident_at(trees, i) == Some("use") {
            let end = (i..trees.len())
                .find(|j| punct_at(trees, *j, ';'))
                .unwrap_or(trees.len());
            use_tree(&trees[i + 1..end], &[], &mut out.uses);
            i = end + 1;
            continue;
        }
        if let Tree::Group(_, inner) = &trees[i] {
            named(inner, out);
            i += 1;
            continue;
        }
        let starts_path = ident_at(trees, i).is_some()
            && path_sep_at(trees, i + 1)
            && ident_at(trees, i + 2).is_some()
            && !(i >= 1 && (path_sep_at(trees, i - 1) || punct_at(trees, i - 1, '.')));
        if !starts_path {
            i += 1;
            continue;
        }
        let mut path = vec![ident_at(trees, i).unwrap_or_default().to_owned()];
        i += 1;
        while path_sep_at(trees, i) {
            match ident_at(trees, i + 1) {
                Some(segment) => path.push(segment.to_owned()),
                None => break,
            }
            i += 2;
        }
        out.paths.push(path);
    }
}

/// The leaves of the `use` tree `trees` under `prefix`: the full path of each (a glob ends in
/// `*`) and the name it binds.
fn use_tree(trees: &[Tree], prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    let mut path = prefix.to_vec();
    let mut i = 0;
    // `$crate` in a macro is this crate.
    if punct_at(trees, i, '$') {
        i += 1;
    }
    if path.is_empty() && path_sep_at(trees, i) {
        // `use ::name`: another crate.
        return;
    }
    loop {
        match trees.get(i) {
            Some(Tree::Tok(Tok::Ident(segment))) => {
                path.push(segment.clone());
                i += 1;
            }
            Some(Tree::Tok(Tok::Punct('*'))) => {
                path.push("*".to_owned());
                out.push((path, None));
                return;
            }
            Some(Tree::Group('{', inner)) => {
                for branch in inner.split(|tree| *tree == Tree::Tok(Tok::Punct(','))) {
                    if !branch.is_empty() {
                        use_tree(branch, &path, out);
                    }
                }
                return;
            }
            _ => return,
        }
        if !path_sep_at(trees, i) {
            break;
        }
        i += 1;
    }
    if path.last().is_some_and(|last| last == "self") {
        path.pop();
    }
    let binding = match (ident_at(trees, i), ident_at(trees, i + 1)) {
        (Some("as"), Some("_")) => None,
        (Some("as"), Some(alias)) => Some(alias.to_owned()),
        _ => path.last().cloned(),
    };
    out.push((path, binding));
}

/// How the paths of one module resolve.
struct Resolver<'a> {
    tree: &'a Crate,
    module: &'a [String],
    /// Modules brought in by `use`, by the name they are bound to.
    aliases: BTreeMap<String, ModPath>,
    /// What the crate root imports or re-exports, by name.
    root_items: &'a BTreeMap<String, Vec<String>>,
}

impl Resolver<'_> {
    /// The path from the crate root that `path`, written in the module, names; `None` for
    /// another crate's.
    fn resolve(&self, path: &[String]) -> Option<Vec<String>> {
        let (first, rest) = path.split_first()?;
        let mut absolute = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.module.to_vec(),
            "super" => {
                let up = 1 + rest.iter().take_while(|s| *s == "super").count();
                let kept = self.module.len().checked_sub(up)?;
                let mut absolute = self.module[..kept].to_vec();
                absolute.extend(rest[up - 1..].iter().cloned());
                return Some(self.through_root(absolute));
            }
            name => {
                if let Some(module) = self.aliases.get(name) {
                    module.clone()
                } else {
                    let mut child = self.module.to_vec();
                    child.push(name.to_owned());
                    if !self.tree.is_module(&child) {
                        return None;
                    }
                    child
                }
            }
        };
        absolute.extend(rest.iter().cloned());
        Some(self.through_root(absolute))
    }

    /// `absolute` with a first segment the crate root imports replaced by where it comes
    /// from.
    fn through_root(&self, absolute: Vec<String>) -> Vec<String> {
        match absolute.split_first() {
            Some((first, rest)) if !self.tree.is_module(std::slice::from_ref(first)) => {
                match self.root_items.get(first) {
                    Some(target) => target.iter().chain(rest).cloned().collect(),
                    None => absolute,
                }
            }
            _ => absolute,
        }
    }
}

/// What the crate root's `use` declarations bind, by name: where each comes from.
fn root_items(tree: &Crate) -> BTreeMap<String, Vec<String>> {
    let mut named_in_root = Named::default();
    if let Some(code) = tree.modules.get(&Vec::new()) {
        named(code, &mut named_in_root);
    }
    let empty = BTreeMap::new();
    let resolver = Resolver {
        tree,
        module: &[],
        aliases: BTreeMap::new(),
        root_items: &empty,
    };
    named_in_root
        .uses
        .iter()
        .filter_map(|(path, binding)| Some((binding.clone()?, resolver.resolve(path)?)))
        .collect()
}

/// One reference: the module whose code holds it, and the path from the crate root it names.
struct Reference {
    from: ModPath,
    to: Vec<String>,
}

/// Every reference in the crate's modules to a path inside the crate.
fn references(tree: &Crate) -> Vec<Reference> {
    let root_items = root_items(tree);
    let mut found = Vec::new();
    for (module, code) in &tree.modules {
        let mut names = Named::default();
        named(code, &mut names);
        let mut resolver = Resolver {
            tree,
            module,
            aliases: BTreeMap::new(),
            root_items: &root_items,
        };
        let aliases = names
            .uses
            .iter()
            .filter_map(|(path, binding)| {
                let to = resolver.resolve(path)?;
                tree.is_module(&to).then_some((binding.clone()?, to))
            })
            .collect();
        resolver.aliases = aliases;
        let paths = names.uses.iter().map(|(path, _)| path).chain(&names.paths);
        found.extend(paths.filter_map(|path| {
            Some(Reference {
                from: module.clone(),
                to: resolver.resolve(path)?,
            })
        }));
    }
    found
}

/// Whether `ancestor` is `path` or one of its ancestors.
fn within(path: &[String], ancestor: &[String]) -> bool {
    path.starts_with(ancestor)
}

/// One sentence per pair of modules of `tree` that refer to each other, at the highest level
/// only, sorted.
fn pairs(tree: &Crate) -> Vec<String> {
    // (A, B) -> what A takes from B, for every A that refers to B.
    let mut edges: BTreeMap<(ModPath, ModPath), BTreeSet<String>> = BTreeMap::new();
    for Reference { from, to } in references(tree) {
        let depth = (0..=to.len())
            .rev()
            .find(|depth| tree.is_module(&to[..*depth]))
            .unwrap_or(0);
        let (module, item) = (&to[..depth], to.get(depth));
        let common = from.iter().zip(module).take_while(|(a, b)| a == b).count();
        // Every (A, B) with A holding `from` and B holding `module`, both below where they
        // part: none when one is inside the other.
        for a in common + 1..=from.len() {
            for b in common + 1..=module.len() {
                let mut taken: Vec<&str> = module[b..].iter().map(String::as_str).collect();
                taken.extend(item.map(String::as_str));
                let name = if taken.is_empty() {
                    module[b - 1].clone()
                } else {
                    taken.join("::")
                };
                edges
                    .entry((from[..a].to_vec(), module[..b].to_vec()))
                    .or_default()
                    .insert(name);
            }
        }
    }
    let mutual: Vec<(&ModPath, &ModPath)> = edges
        .keys()
        .filter(|(a, b)| shown(a) < shown(b) && edges.contains_key(&(b.clone(), a.clone())))
        .map(|(a, b)| (a, b))
        .collect();
    let covered = |(a, b): (&ModPath, &ModPath)| {
        mutual.iter().any(|&(x, y)| {
            (x, y) != (a, b) && ((within(a, x) && within(b, y)) || (within(a, y) && within(b, x)))
        })
    };
    let mut found: Vec<String> = mutual
        .iter()
        .filter(|pair| !covered(**pair))
        .map(|&(a, b)| {
            let taken = |from: &ModPath, to: &ModPath| {
                edges[&(from.clone(), to.clone())]
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (a_shown, b_shown) = (shown(a), shown(b));
            format!(
                "modules `{a_shown}` and `{b_shown}` refer to each other \
                 ({a_shown} -> {b_shown}: {}; {b_shown} -> {a_shown}: {})",
                taken(a, b),
                taken(b, a)
            )
        })
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::workspace::Target;

    /// A crate written to a fresh folder under the system's temporary one, removed on drop.
    struct Synthetic {
        root: PathBuf,
    }

    impl Synthetic {
        /// A package `demo` at the folder's root whose library is `src/lib.rs`, with `files`
        /// given as (path, text).
        fn new(files: &[(&str, &str)]) -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let root = std::env::temp_dir().join(format!(
                "xtask-modules-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            for (path, text) in files {
                let file = root.join(path);
                std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                std::fs::write(file, text).unwrap();
            }
            Self { root }
        }

        fn problems_of(&self, targets: &[(&str, TargetKind, &str)]) -> Vec<String> {
            let package = Package {
                name: "demo".to_owned(),
                dir: String::new(),
                deps: Vec::new(),
                targets: targets
                    .iter()
                    .map(|(name, kind, src)| Target {
                        name: (*name).to_owned(),
                        kind: *kind,
                        src: (*src).to_owned(),
                    })
                    .collect(),
            };
            check(&self.root, &[package]).unwrap()
        }

        fn problems(&self) -> Vec<String> {
            self.problems_of(&[("demo", TargetKind::Lib, "src/lib.rs")])
        }
    }

    impl Drop for Synthetic {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    /// The problems of a library whose `src/lib.rs` declares `mod a; mod b;` and whose
    /// `a.rs` and `b.rs` hold `a` and `b`.
    fn a_and_b(a: &str, b: &str) -> Vec<String> {
        Synthetic::new(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", a),
            ("src/b.rs", b),
        ])
        .problems()
    }

    const A_TAKES_B: &str = "use crate::b::{Y, Z};\npub struct X;\n";

    #[test]
    fn a_mutual_pair_is_reported_with_what_each_side_takes() {
        assert_eq!(
            a_and_b(
                A_TAKES_B,
                "pub struct Y;\npub struct Z;\npub fn f() -> crate::a::X { crate::a::X }\n"
            ),
            ["demo: modules `a` and `b` refer to each other (a -> b: Y, Z; b -> a: X)"]
        );
    }

    #[test]
    fn one_way_references_and_longer_cycles_are_not_reported() {
        assert_eq!(
            a_and_b(A_TAKES_B, "pub struct Y;\npub struct Z;\n"),
            Vec::<String>::new()
        );
        let cycle_of_three = Synthetic::new(&[
            ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
            ("src/b.rs", "use crate::c::C;\npub struct B;\n"),
            ("src/c.rs", "use crate::a::A;\npub struct C;\n"),
        ]);
        assert_eq!(cycle_of_three.problems(), Vec::<String>::new());
    }

    #[test]
    fn parents_and_children_may_use_each_other() {
        let crate_ = Synthetic::new(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            (
                "src/a.rs",
                "mod inner;\nuse inner::Deep;\npub struct X;\npub fn f() -> self::inner::Deep { todo!() }\n",
            ),
            (
                "src/a/inner.rs",
                "use super::X;\npub struct Deep(crate::a::X);\n",
            ),
            (
                "src/b.rs",
                "mod child { pub use super::*; }\npub struct Y;\n",
            ),
        ]);
        assert_eq!(crate_.problems(), Vec::<String>::new());
    }

    #[test]
    fn the_crate_root_is_never_one_side() {
        // The root re-exports and uses both; `a` and `b` use the root's own items.
        let crate_ = Synthetic::new(&[
            (
                "src/lib.rs",
                "mod a;\nmod b;\npub use a::X;\npub use b::Y;\npub struct Shared;\n\
                 pub fn f() { a::g(); b::h(); }\n",
            ),
            (
                "src/a.rs",
                "use crate::Shared;\npub struct X;\npub fn g() {}\n",
            ),
            (
                "src/b.rs",
                "use super::Shared;\npub struct Y;\npub fn h() {}\n",
            ),
        ]);
        assert_eq!(crate_.problems(), Vec::<String>::new());
    }

    #[test]
    fn a_path_through_a_root_re_export_reaches_the_module_it_comes_from() {
        let crate_ = Synthetic::new(&[
            ("src/lib.rs", "mod a;\nmod b;\npub use b::Y;\n"),
            ("src/a.rs", "pub struct X(crate::Y);\n"),
            ("src/b.rs", "pub struct Y;\npub fn f(_: crate::a::X) {}\n"),
        ]);
        assert_eq!(
            crate_.problems(),
            ["demo: modules `a` and `b` refer to each other (a -> b: Y; b -> a: X)"]
        );
    }

    #[test]
    fn super_self_and_nested_use_groups_resolve() {
        let crate_ = Synthetic::new(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "mod inner;\n"),
            (
                "src/a/inner.rs",
                "use super::super::b::{c::X, d::{Y, Z}};\npub struct W;\n",
            ),
            (
                "src/b.rs",
                "pub mod c { pub struct X; }\npub mod d {\n    pub struct Y;\n    pub struct Z;\n}\n\
                 use crate::{a::inner::W, b::c::X};\nfn f() -> self::c::X { todo!() }\n",
            ),
        ]);
        assert_eq!(
            crate_.problems(),
            ["demo: modules `a` and `b` refer to each other \
                 (a -> b: c::X, d::Y, d::Z; b -> a: inner::W)"]
        );
    }

    #[test]
    fn a_module_imported_by_use_is_followed() {
        assert_eq!(
            a_and_b(
                A_TAKES_B,
                "use crate::a as other;\npub struct Y;\npub struct Z;\n\
                 fn f() -> other::X { todo!() }\n"
            ),
            ["demo: modules `a` and `b` refer to each other (a -> b: Y, Z; b -> a: X, a)"]
        );
    }

    #[test]
    fn references_in_tests_are_ignored() {
        let in_tests = [
            "#[cfg(test)]\nmod checks {\n    use crate::a::X;\n}\n",
            "mod tests {\n    use crate::a::X;\n}\n",
            "#[cfg(test)]\nfn helper() -> crate::a::X {\n    todo!()\n}\n",
            "#[cfg(all(test, unix))]\nuse crate::a::X;\n",
            "pub fn f() {\n    #[cfg(test)]\n    let _x = crate::a::X;\n}\n",
            "pub struct S {\n    #[cfg(test)]\n    x: crate::a::X,\n}\n",
            "impl S {\n    #[cfg(test)]\n    pub(crate) fn x() -> crate::a::X {\n        todo!()\n    }\n}\npub struct S;\n",
        ];
        for b in in_tests {
            let found = a_and_b(A_TAKES_B, &format!("pub struct Y;\npub struct Z;\n{b}"));
            assert_eq!(found, Vec::<String>::new(), "{b}");
        }
        // The same code outside tests is a reference, and so is the code after a gated part.
        let in_code = [
            "#[cfg(not(test))]\nuse crate::a::X;\n",
            "#[cfg(any(test, feature = \"x\"))]\nuse crate::a::X;\n",
            "mod checks {\n    use crate::a::X;\n}\n",
            "#[cfg(test)]\nfn helper() {}\npub type T = crate::a::X;\n",
            "pub fn f() {\n    #[cfg(test)]\n    {\n        let _ = 1;\n    }\n    let _ = crate::a::X;\n}\n",
            "pub fn f() {\n    #[cfg(test)]\n    check! { 1 }\n    let _ = crate::a::X;\n}\n",
        ];
        for b in in_code {
            let found = a_and_b(A_TAKES_B, &format!("pub struct Y;\npub struct Z;\n{b}"));
            assert_eq!(found.len(), 1, "{b}");
        }
    }

    #[test]
    fn a_file_gated_by_an_inner_cfg_test_is_left_out() {
        let crate_ = Synthetic::new(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", A_TAKES_B),
            ("src/b.rs", "pub struct Y;\npub struct Z;\nmod helpers;\n"),
            ("src/b/helpers.rs", "#![cfg(test)]\nuse crate::a::X;\n"),
        ]);
        assert_eq!(crate_.problems(), Vec::<String>::new());
    }

    #[test]
    fn paths_in_comments_and_strings_are_ignored() {
        let b = "pub struct Y;\npub struct Z;\n\
                 // use crate::a::X;\n\
                 /* crate::a::X /* nested */ crate::a::X */\n\
                 /// See [`X`](crate::a::X).\n\
                 pub const S: &str = \"crate::a::X \\\" crate::a::X\";\n\
                 pub const R: &str = r#\"crate::a::X \" crate::a::X\"#;\n\
                 pub const B: &[u8] = b\"crate::a::X\";\n\
                 pub const Q: char = '\"';\n\
                 pub fn f<'a>(s: &'a str) -> &'a str { s }\n\
                 pub const E: char = '\\'';\n\
                 pub const T: &str = \"crate::a::X\";\n";
        assert_eq!(a_and_b(A_TAKES_B, b), Vec::<String>::new());
        // After all that, the lexer is still in step: a real path is seen.
        let found = a_and_b(A_TAKES_B, &format!("{b}pub type T2 = crate::a::X;\n"));
        assert_eq!(found.len(), 1, "{found:?}");
    }

    #[test]
    fn a_pair_is_reported_at_the_highest_level_only() {
        let crate_ = Synthetic::new(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "pub mod x;\n"),
            ("src/a/x.rs", "use crate::b::y::Y;\npub struct X;\n"),
            ("src/b/mod.rs", "pub mod y;\n"),
            ("src/b/y.rs", "use crate::a::x::X;\npub struct Y;\n"),
        ]);
        assert_eq!(
            crate_.problems(),
            ["demo: modules `a` and `b` refer to each other (a -> b: y::Y; b -> a: x::X)"]
        );
    }

    #[test]
    fn a_pair_inside_one_module_is_named_by_its_full_path() {
        // `y` is where its `#[path]` says, relative to the folder of `outer.rs`.
        let crate_ = Synthetic::new(&[
            ("src/main.rs", "mod outer;\nfn main() {}\n"),
            (
                "src/outer.rs",
                "mod x;\n#[path = \"elsewhere/why.rs\"]\nmod y;\n",
            ),
            ("src/outer/x.rs", "use super::y::Y;\npub struct X;\n"),
            ("src/elsewhere/why.rs", "use super::x::X;\npub struct Y;\n"),
        ]);
        assert_eq!(
            crate_.problems_of(&[("tool", TargetKind::Bin, "src/main.rs")]),
            [
                "demo (bin tool): modules `outer::x` and `outer::y` refer to each other \
                 (outer::x -> outer::y: Y; outer::y -> outer::x: X)"
            ]
        );
    }

    #[test]
    fn a_missing_module_file_is_a_problem() {
        let crate_ = Synthetic::new(&[("src/lib.rs", "mod gone;\n")]);
        assert_eq!(
            crate_.problems(),
            [
                "demo: src/lib.rs declares `mod gone;` but there is no src/gone.rs nor src/gone/mod.rs"
            ]
        );
    }

    #[test]
    fn test_and_example_targets_and_files_are_not_read() {
        let crate_ = Synthetic::new(&[
            ("tests/it/main.rs", "mod gone;\n"),
            (
                "src/lib.rs",
                "mod a;\n#[path = \"../tests/support.rs\"]\nmod support;\n",
            ),
            ("src/a.rs", "use crate::support::S;\npub struct X;\n"),
            ("tests/support.rs", "pub struct S(crate::a::X);\n"),
        ]);
        assert_eq!(
            crate_.problems_of(&[
                ("it", TargetKind::Other, "tests/it/main.rs"),
                ("demo", TargetKind::Lib, "src/lib.rs"),
            ]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn unbalanced_source_is_an_error() {
        let crate_ = Synthetic::new(&[("src/lib.rs", "mod a { fn f() }\n}\n")]);
        let package = Package {
            name: "demo".to_owned(),
            dir: String::new(),
            deps: Vec::new(),
            targets: vec![Target {
                name: "demo".to_owned(),
                kind: TargetKind::Lib,
                src: "src/lib.rs".to_owned(),
            }],
        };
        let error = check(&crate_.root, &[package]).unwrap_err();
        assert!(
            format!("{error:#}").contains("src/lib.rs: unbalanced `}`"),
            "{error:#}"
        );
    }
}

//! The dependency rules of docs/architecture.md ("Dependency rules (checked)"), read from its
//! table and checked on the source text: what each module may import from the crate, the
//! nevers, and no two files importing each other. Also: only `cli/` prints; every plaintext
//! exposure of a secret is a reviewed `expect`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

#[test]
fn only_cli_prints() {
    for path in rust_files(Path::new("src")) {
        if path.starts_with("src/cli") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        for call in ["println!", "eprintln!", "print!(", "eprint!("] {
            assert!(!text.contains(call), "{path:?} prints with {call}");
        }
    }
}

#[test]
fn every_plaintext_exposure_is_a_reviewed_expect() {
    for path in rust_files(Path::new("src")) {
        let text = fs::read_to_string(&path).unwrap();
        let uses = text.matches(".expose_secret()").count()
            + text.matches("ExposeSecret::expose_secret(").count();
        let reviewed = text.matches("clippy::disallowed_methods").count();
        assert!(
            uses <= reviewed,
            "{path:?}: {uses} expose_secret call(s), {reviewed} reviewed"
        );
    }
}

/// The rules table of docs/architecture.md: module → (may import, never in particular).
type Rules = BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>;

/// The backticked names in a table cell.
fn names(cell: &str) -> BTreeSet<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn rules(doc: &str) -> Rules {
    let section = doc
        .split("## Dependency rules (checked)")
        .nth(1)
        .expect("docs/architecture.md has its \"Dependency rules (checked)\" section");
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut rules = Rules::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let module = names(cells[1]).into_iter().next().unwrap();
        rules.insert(module, (names(cells[2]), names(cells[3])));
    }
    rules
}

/// The crate's top-level modules (`pub mod` in src/lib.rs).
fn modules() -> BTreeSet<String> {
    fs::read_to_string("src/lib.rs")
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_owned())
        .collect()
}

/// A file's code: comment lines and its test module (last, by STYLE.md) left out.
fn code(text: &str) -> String {
    let text = text.split("\n#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module path of a file under `src/` (`src/a/b.rs` and `src/a/b/mod.rs` are `[a, b]`).
fn module_of(path: &Path) -> Vec<String> {
    let rel = path.strip_prefix("src").unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The file a module path names, its longest prefix that is a file (an item is in its module's
/// file).
fn file_of(path: &[String]) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|n| {
        let base = Path::new("src").join(path[..n].join("/"));
        [base.with_extension("rs"), base.join("mod.rs")]
            .into_iter()
            .find(|f| f.is_file())
    })
}

/// Every crate path the file at `path` names (see [`imports_in`]).
fn imports(path: &Path) -> Vec<Vec<String>> {
    imports_in(&fs::read_to_string(path).unwrap(), &module_of(path))
}

/// Every crate path `text`'s code names (`crate::…`, `super::…`, `self::…`, braces expanded),
/// resolved to module paths from the crate root; `here` is the file's module.
fn imports_in(text: &str, here: &[String]) -> Vec<Vec<String>> {
    let text = code(text);
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    for start in ["crate::", "super::", "self::"]
        .iter()
        .flat_map(|p| text.match_indices(p).map(|(at, _)| at))
    {
        // A path starts a word (not `foo_self::`, not `pub(in super::super)`'s second half).
        if start > 0
            && (bytes[start - 1].is_ascii_alphanumeric()
                || bytes[start - 1] == b'_'
                || bytes[start - 1] == b':')
        {
            continue;
        }
        let rest = &text[start..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let head = rest[..end].trim_end_matches(':');
        let mut segments: Vec<String> = Vec::new();
        for (n, segment) in head.split("::").enumerate() {
            match segment {
                "crate" if n == 0 => {}
                "self" if n == 0 => segments = here.to_vec(),
                "super" => {
                    if segments.is_empty() && n == 0 {
                        segments = here.to_vec();
                    }
                    segments.pop();
                }
                other => segments.push(other.to_owned()),
            }
        }
        let tails: Vec<String> = if rest[end..].starts_with('{') {
            let close = rest[end..].find('}').unwrap();
            rest[end + 1..end + close]
                .split(',')
                .map(|item| {
                    item.split(" as ")
                        .next()
                        .unwrap_or_default()
                        .trim()
                        .to_owned()
                })
                .filter(|item| !item.is_empty())
                .collect()
        } else {
            vec![String::new()]
        };
        for tail in tails {
            let mut full = segments.clone();
            full.extend(
                tail.split("::")
                    .filter(|s| !s.is_empty() && *s != "self" && *s != "*")
                    .map(str::to_owned),
            );
            found.push(full);
        }
    }
    found
}

#[test]
fn every_module_imports_only_what_the_architecture_allows() {
    let doc = fs::read_to_string("docs/architecture.md").unwrap();
    let rules = rules(&doc);
    let modules = modules();
    assert_eq!(
        rules.keys().cloned().collect::<BTreeSet<_>>(),
        modules,
        "the rules table names every module of src/lib.rs, and no other"
    );
    for (module, (allowed, never)) in &rules {
        let both: Vec<_> = allowed.intersection(never).collect();
        assert!(
            both.is_empty(),
            "`{module}` both allows and never imports {both:?}"
        );
        for name in allowed.iter().chain(never.iter()) {
            assert!(
                modules.contains(name),
                "`{module}`'s rule names `{name}`, no module"
            );
        }
    }
    let mut broken = Vec::new();
    for path in rust_files(Path::new("src")) {
        let module = module_of(&path);
        broken.extend(breaks(&rules, &path, &module, &imports(&path)));
    }
    assert!(
        broken.is_empty(),
        "imports docs/architecture.md does not allow:\n{}",
        broken.join("\n")
    );
}

/// The imports of the file at `path` (module `module`) its rules do not allow.
fn breaks(rules: &Rules, path: &Path, module: &[String], imports: &[Vec<String>]) -> Vec<String> {
    let Some((top, (allowed, never))) = module.first().and_then(|m| rules.get_key_value(m)) else {
        return Vec::new(); // src/lib.rs, src/main.rs
    };
    imports
        .iter()
        .filter_map(|import| {
            let target = import.first()?;
            if target == top || !rules.contains_key(target) || allowed.contains(target) {
                return None;
            }
            let rule = if never.contains(target) {
                "a never"
            } else {
                "not allowed"
            };
            Some(format!(
                "{}: `{top}` imports `{}` ({rule})",
                path.display(),
                import.join("::")
            ))
        })
        .collect()
}

#[test]
fn no_two_files_import_each_other() {
    let files = rust_files(Path::new("src"));
    let mut edges: BTreeSet<(PathBuf, PathBuf)> = BTreeSet::new();
    for path in &files {
        for import in imports(path) {
            if let Some(target) = file_of(&import)
                && target != *path
            {
                edges.insert((path.clone(), target));
            }
        }
    }
    let pairs = pairs(&edges);
    assert!(
        pairs.is_empty(),
        "files that import each other:\n{}",
        pairs.join("\n")
    );
}

/// The pairs of files that import each other, a module's root (`mod.rs`) and the files it
/// declares aside: the root dispatches to its children, and they may use what it holds.
fn pairs(edges: &BTreeSet<(PathBuf, PathBuf)>) -> Vec<String> {
    let root_and_child = |a: &Path, b: &Path| {
        let root_of = |root: &Path, child: &Path| {
            root.file_name().is_some_and(|n| n == "mod.rs")
                && (child.parent() == root.parent()
                    || child.parent().and_then(Path::parent) == root.parent()
                        && child.file_name().is_some_and(|n| n == "mod.rs"))
        };
        root_of(a, b) || root_of(b, a)
    };
    edges
        .iter()
        .filter(|(a, b)| a < b && edges.contains(&(b.clone(), a.clone())))
        .filter(|(a, b)| !root_and_child(a, b))
        .map(|(a, b)| format!("{} <-> {}", a.display(), b.display()))
        .collect()
}

#[test]
fn the_checker_sees_a_planted_break_of_each_kind() {
    // The checker itself, on a planted file of each kind, so that a rule cannot pass vacuously.
    let doc = fs::read_to_string("docs/architecture.md").unwrap();
    let rules = rules(&doc);
    assert!(
        rules["api"].1.contains("broker"),
        "api never imports broker"
    );
    assert!(
        rules["broker"].1.contains("roster"),
        "broker never imports roster"
    );
    assert!(
        !rules["mailbox"].0.contains("broker"),
        "mailbox may not import broker"
    );
    // Read as if it were src/daemon/planted.rs (for `super`).
    let planted = "use crate::broker::link::LinkStatus;\nuse super::{gateway::Gateway, exit};\n\
         // use crate::pane::Tmux; (a comment: not an import)\n\
         fn f() { crate::roster::Roster::new(); }\n#[cfg(test)]\nmod tests { use crate::daemon::X; }\n";
    let found: Vec<String> = imports_in(planted, &["daemon".to_owned(), "planted".to_owned()])
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        found,
        [
            "broker::link::LinkStatus",
            "roster::Roster::new",
            "daemon::gateway::Gateway",
            "daemon::exit",
        ],
        "crate and super paths found, braces expanded, comments and the test module left out"
    );
    // Each rule fails on a planted break: a never, an import not allowed, a pair of files.
    let module = |path: &str| module_of(Path::new(path));
    let planted = [
        (
            "src/api/mod.rs",
            "use crate::broker::link::LinkStatus;",
            "a never",
        ),
        (
            "src/broker/link.rs",
            "use crate::roster::Roster;",
            "a never",
        ),
        (
            "src/mailbox/mod.rs",
            "use crate::audit::Audit;",
            "not allowed",
        ),
        (
            "src/agent/mod.rs",
            "fn f() { crate::policy::load_dir(p); }",
            "not allowed",
        ),
        ("src/route/mod.rs", "use crate::pane::PaneId;", "a never"),
    ];
    for (path, text, rule) in planted {
        let found = breaks(
            &rules,
            Path::new(path),
            &module(path),
            &imports_in(text, &module(path)),
        );
        assert!(
            found.len() == 1 && found[0].ends_with(&format!("({rule})")),
            "{path} with `{text}`: {found:?}"
        );
    }
    let allowed = "use crate::state::Shelf;";
    let module_path = module("src/mailbox/mod.rs");
    assert!(
        breaks(
            &rules,
            Path::new("src/mailbox/mod.rs"),
            &module_path,
            &imports_in(allowed, &module_path)
        )
        .is_empty()
    );
    let edge = |a: &str, b: &str| (PathBuf::from(a), PathBuf::from(b));
    let planted_pair: BTreeSet<_> = [
        edge("src/daemon/gateway.rs", "src/daemon/spawning.rs"),
        edge("src/daemon/spawning.rs", "src/daemon/gateway.rs"),
        edge("src/daemon/mod.rs", "src/daemon/inject.rs"),
        edge("src/daemon/inject.rs", "src/daemon/mod.rs"),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        pairs(&planted_pair),
        ["src/daemon/gateway.rs <-> src/daemon/spawning.rs"],
        "siblings importing each other are a pair; a root and its child are not"
    );
    assert_eq!(
        file_of(&["daemon".into(), "gateway".into(), "Gateway".into()]),
        Some(PathBuf::from("src/daemon/gateway.rs"))
    );
    assert_eq!(
        file_of(&["broker".into(), "link".into(), "LinkStatus".into()]),
        Some(PathBuf::from("src/broker/link.rs"))
    );
}

//! The dependency direction of STYLE.md §2, checked on the source text.

#![allow(clippy::unwrap_used, reason = "test code fails loudly")]

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
fn leaf_modules_import_nothing_from_the_rest_of_the_crate() {
    for leaf in ["scrub", "secret", "pane", "state"] {
        let files = rust_files(&Path::new("src").join(leaf));
        assert!(!files.is_empty(), "src/{leaf} exists");
        for path in files {
            let text = fs::read_to_string(&path).unwrap();
            assert!(!text.contains("crate::"), "{path:?} imports crate::");
        }
    }
}

#[test]
fn the_agent_registry_and_the_mailbox_import_only_the_state_store() {
    for module in ["agent", "mailbox"] {
        let files = rust_files(&Path::new("src").join(module));
        assert!(!files.is_empty(), "src/{module} exists");
        for path in files {
            let text = fs::read_to_string(&path).unwrap();
            for (at, _) in text.match_indices("crate::") {
                let rest = text.get(at..).unwrap_or_default();
                assert!(
                    rest.starts_with("crate::state"),
                    "{path:?} imports {}",
                    rest.lines().next().unwrap_or_default()
                );
            }
        }
    }
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
fn config_imports_only_settings_and_the_detector() {
    for path in rust_files(Path::new("src/config")) {
        let text = fs::read_to_string(&path).unwrap();
        for forbidden in ["crate::daemon", "crate::cli", "crate::pane"] {
            assert!(!text.contains(forbidden), "{path:?} imports {forbidden}");
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

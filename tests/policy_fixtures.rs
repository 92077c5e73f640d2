//! Policy fixtures: `valid/` loads clean; each `invalid/<case>.toml` renders exactly the
//! diagnostics in `<case>.expected` (set `FLEETD_BLESS=1` to rewrite them after a reviewed change).

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code fails loudly")]

use std::path::{Path, PathBuf};

use fleetd::policy::{self, Severity};

#[test]
fn valid_fixtures_load_without_errors() {
    let (result, diagnostics) = policy::load_dir(Path::new("tests/fixtures/policy/valid"));
    let errors: Vec<String> = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(|d| d.render())
        .collect();
    assert!(result.is_ok(), "{}", errors.join("\n"));
}

#[test]
fn invalid_fixtures_render_their_expected_diagnostics() {
    let dir = Path::new("tests/fixtures/policy/invalid");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 8, "fixtures present");
    let bless = std::env::var_os("FLEETD_BLESS").is_some();
    for case in cases {
        let text = std::fs::read_to_string(&case).unwrap();
        let (result, diagnostics) = policy::load_sources(&[(case.clone(), text)]);
        assert!(result.is_err(), "{case:?} must be invalid");
        let rendered: String = diagnostics
            .iter()
            .map(|d| d.render())
            .collect::<Vec<_>>()
            .join("\n");
        let expected_path = case.with_extension("expected");
        if bless {
            std::fs::write(&expected_path, &rendered).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_else(|_| {
            panic!("{expected_path:?} is missing; run with FLEETD_BLESS=1 and review it")
        });
        assert_eq!(rendered, expected, "{case:?}");
    }
}

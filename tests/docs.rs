//! The threat model's proofs are real: every row of docs/threat-model.md names at least one
//! test file, and every test it names by function exists in that file.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code: a failed step is a failed test"
)]

use std::path::Path;

#[test]
fn every_threat_names_tests_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docs/threat-model.md")).unwrap();
    let table = &text[text.find("## Threats").expect("a `## Threats` section")..];
    let mut rows = 0;
    for line in table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| threat"))
    {
        rows += 1;
        let proof = line.trim_end_matches('|').rsplit(" | ").next().unwrap();
        let mut named = 0;
        for item in proof.split('`').skip(1).step_by(2) {
            if !["src/", "tests/", "policy/"]
                .iter()
                .any(|p| item.starts_with(p))
            {
                continue;
            }
            let mut parts = item.split("::");
            let file = root.join(parts.next().unwrap());
            assert!(file.exists(), "{} is missing (row: {line})", file.display());
            named += 1;
            let source = std::fs::read_to_string(&file).unwrap_or_default();
            for part in parts.filter(|p| *p != "tests") {
                let found = if part.contains('…') {
                    source.contains(part.trim_matches('…'))
                } else {
                    source.contains(&format!("fn {part}"))
                        || source.contains(&format!("mod {part}"))
                };
                assert!(found, "`{part}` is not in {} (row: {line})", file.display());
            }
        }
        assert!(named > 0, "a threat without a test: {line}");
    }
    assert!(rows >= 40, "only {rows} rows: did the table move?");
}

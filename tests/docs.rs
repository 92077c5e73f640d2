//! The docs stay true to the code: every row of docs/threat-model.md names at least one test
//! file, and every test it names by function exists in that file; docs/operations.md's audit
//! event table lists exactly the events the code writes.

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

/// docs/operations.md lists every audit event the code writes, and nothing else. An audit event
/// is a string literal `"message.…"`, `"receipt.…"`, `"spawn.…"`, `"lead.…"`, `"api.…"` or
/// `"agent.…"` in `src/`, except the envelope kinds that share the `spawn.` and `agent.` prefixes
/// and the local API's operation names.
#[test]
fn the_audit_event_table_matches_the_code() {
    use std::collections::BTreeSet;
    const KINDS: [&str; 5] = [
        "spawn.request",
        "spawn.reply",
        "agent.message",
        "agent.open",
        "agent.unblock",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let section = &text[text
        .find("## The audit log")
        .expect("a `## The audit log` section")..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let documented: BTreeSet<String> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('`').nth(1).map(str::to_owned))
        .collect();

    let mut written = BTreeSet::new();
    let mut files = vec![root.join("src")];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        // herdr's own protocol methods (`agent.start` …) are not audit events.
        if path.extension().is_none_or(|e| e != "rs") || path.starts_with(root.join("src/pane")) {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        for literal in source.split('"').skip(1).step_by(2) {
            let is_event = [
                "message.",
                "receipt.",
                "spawn.",
                "lead.",
                "api.",
                "agent.",
                "multiplexer.",
            ]
            .iter()
            .any(|prefix| literal.starts_with(prefix))
                && literal[literal.find('.').unwrap() + 1..]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
                // A bare prefix (`"agent."` parsing a routing key) names no event.
                && !literal.ends_with('.')
                && !KINDS.contains(&literal);
            if is_event {
                written.insert(literal.to_owned());
            }
        }
    }
    assert!(written.len() >= 10, "only {written:?}: did the scan break?");
    assert_eq!(
        documented, written,
        "docs/operations.md's audit events (left) and the code's (right) differ"
    );
}

//! systemd's syscall groups, read from the real `systemd-analyze syscall-filter` and expanded,
//! so the test harness filters exactly what the unit's `SystemCallFilter=` lines name.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Every group systemd knows, with its direct members (names and `@nested` groups).
pub fn groups() -> BTreeMap<String, Vec<String>> {
    let output = Command::new("systemd-analyze")
        .arg("syscall-filter")
        .output()
        .unwrap_or_else(|e| {
            panic!("systemd-analyze is missing ({e}): install systemd (scripts/test does)")
        });
    let text = String::from_utf8_lossy(&output.stdout);
    let mut groups = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if !line.starts_with(' ') && trimmed.starts_with('@') {
            current = Some(trimmed.to_owned());
            groups.insert(trimmed.to_owned(), Vec::new());
        } else if let Some(group) = &current
            && line.starts_with(' ')
        {
            groups.get_mut(group).unwrap().push(trimmed.to_owned());
        } else {
            current = None; // "# Unlisted" and similar trailers
        }
    }
    assert!(
        groups.contains_key("@system-service"),
        "no @system-service in: {text}"
    );
    groups
}

/// The syscall names in `item` (a name or a `@group`), nested groups expanded.
pub fn expand(groups: &BTreeMap<String, Vec<String>>, item: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let Some(members) = groups.get(item) {
        for member in members {
            out.extend(expand(groups, member));
        }
    } else if !item.starts_with('@') {
        out.insert(item.to_owned());
    }
    out
}

/// What the unit's filter allows: `SystemCallFilter=` lines in order (allow-list, then `~`
/// removals, then additions), as systemd applies them.
pub fn unit_allow_list(unit: &str) -> BTreeSet<String> {
    let groups = groups();
    let mut allowed = BTreeSet::new();
    for line in unit.lines().map(str::trim) {
        let Some(value) = line.strip_prefix("SystemCallFilter=") else {
            continue;
        };
        let (deny, items) = match value.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, value),
        };
        for item in items.split_whitespace() {
            let names = expand(&groups, item);
            if deny {
                allowed.retain(|n| !names.contains(n));
            } else {
                allowed.extend(names);
            }
        }
    }
    allowed
}

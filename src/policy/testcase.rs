//! Policy test cases, kept by reviewers beside the policy in `tests/*.toml`: a request, the
//! expected effect and, optionally, the rule expected to decide it. Like unit tests for policy.
//!
//! ```toml
//! [[case]]
//! name = "mac may start a worker for a task"
//! expect = "allow"          # allow | deny | invalid (the request itself is refused)
//! rule = "mac-workers"      # optional: must be among the deciding rules
//! request = { origin = { fleet = "mac", host = "laptop" }, profile = "worker", env = { TASK_ID = "FLEET-42" } }
//! usage = { running = 0, origin_running = 0, recent = 0 }   # optional
//!
//! [[case]]
//! name = "a laptop agent may not message a worker it did not spawn"
//! expect = "deny"
//! request = { kind = "message", origin = { fleet = "mac", host = "laptop" }, profile = "worker", sender = "other" }
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::eval::{Counts, Effect, evaluate};
use super::message::{Ask, evaluate_message};
use super::model::PolicySet;

/// What a case expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    /// The request is allowed.
    Allow,
    /// The request is denied.
    Deny,
    /// The request is refused as malformed before any rule is consulted.
    Invalid,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TestFile {
    #[serde(default)]
    case: Vec<Spanned<RawCase>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    expect: Expect,
    rule: Option<String>,
    request: toml::Value,
    #[serde(default)]
    usage: Counts,
}

/// The result of running every case.
#[derive(Debug, Default)]
pub struct Report {
    /// Cases that held.
    pub passed: usize,
    /// One line per failing case (or unreadable test file), with file:line.
    pub failures: Vec<String>,
}

/// Runs the cases in `dir/tests/*.toml` against `policy`.
pub fn run(policy: &PolicySet, dir: &Path) -> std::io::Result<Report> {
    let mut report = Report::default();
    let tests = dir.join("tests");
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&tests) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => return Err(error),
    };
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let parsed: TestFile = match toml::from_str(&text) {
            Ok(parsed) => parsed,
            Err(error) => {
                let line = error.span().map_or(1, |s| line_of(&text, s.start));
                report.failures.push(format!(
                    "{}:{line}: invalid test file: {}",
                    file.display(),
                    error.message()
                ));
                continue;
            }
        };
        for case in parsed.case {
            let line = line_of(&text, case.span().start);
            match check(policy, case.get_ref()) {
                Ok(()) => report.passed += 1,
                Err(why) => report.failures.push(format!(
                    "{}:{line}: case `{}`: {why}",
                    file.display(),
                    case.get_ref().name
                )),
            }
        }
    }
    Ok(report)
}

fn check(policy: &PolicySet, case: &RawCase) -> Result<(), String> {
    let json =
        serde_json::to_value(&case.request).map_err(|e| format!("request cannot be read: {e}"))?;
    let request = match Ask::from_value(&json) {
        Ok(request) => request,
        Err(error) if case.expect == Expect::Invalid => {
            return match &case.rule {
                Some(field) if *field != error.field => {
                    Err(format!("expected field `{field}` refused, got {error}"))
                }
                _ => Ok(()),
            };
        }
        Err(error) => return Err(format!("the request is invalid: {error}")),
    };
    let decision = match &request {
        Ask::Spawn(request) => evaluate(policy, request, &case.usage),
        Ask::Message(request) => evaluate_message(policy, request),
    };
    let effect = match decision.effect {
        Effect::Allow => Expect::Allow,
        Effect::Deny => Expect::Deny,
    };
    if effect != case.expect {
        return Err(format!(
            "expected {:?}, got {:?} (rules: {}; {})",
            case.expect,
            effect,
            decision
                .rules
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            decision.reasons.join("; ")
        )
        .to_lowercase());
    }
    if let Some(rule) = &case.rule
        && !decision.rules.iter().any(|r| r.as_str() == rule)
    {
        return Err(format!(
            "expected rule `{rule}`, decided by: {}",
            decision
                .rules
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(())
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(1, |b| b.matches('\n').count() + 1)
}

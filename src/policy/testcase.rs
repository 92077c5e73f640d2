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
use super::request::RequestError;

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

impl Expect {
    /// How a report names it.
    pub fn word(self) -> &'static str {
        match self {
            Expect::Allow => "allow",
            Expect::Deny => "deny",
            Expect::Invalid => "invalid",
        }
    }
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

/// Why a policy test case failed.
#[derive(Debug, thiserror::Error)]
pub enum CaseFailure {
    /// The case's request cannot be read as JSON.
    #[error("request cannot be read: {0}")]
    Unreadable(#[source] serde_json::Error),
    /// The request is refused as invalid for another field than the case expects.
    #[error("expected field `{expected}` refused, got {got}")]
    OtherField {
        /// The field the case names.
        expected: String,
        /// What was refused.
        got: RequestError,
    },
    /// The request is invalid and the case expected a decision.
    #[error("the request is invalid: {0}")]
    Invalid(RequestError),
    /// The policy decided otherwise.
    #[error("expected {}, got {} (rules: {}; {})", expected.word(), got.word(), rules.join(", "), reasons.join("; ").to_lowercase())]
    Effect {
        /// What the case expects.
        expected: Expect,
        /// What the policy decided.
        got: Expect,
        /// The rules that decided.
        rules: Vec<String>,
        /// Their reasons.
        reasons: Vec<String>,
    },
    /// Another rule decided.
    #[error("expected rule `{expected}`, decided by: {}", decided.join(", "))]
    Rule {
        /// The rule the case names.
        expected: String,
        /// The rules that decided.
        decided: Vec<String>,
    },
}

fn check(policy: &PolicySet, case: &RawCase) -> Result<(), CaseFailure> {
    let json = serde_json::to_value(&case.request).map_err(CaseFailure::Unreadable)?;
    let request = match Ask::from_value(&json) {
        Ok(request) => request,
        Err(error) if case.expect == Expect::Invalid => {
            return match &case.rule {
                Some(field) if *field != error.field => Err(CaseFailure::OtherField {
                    expected: field.clone(),
                    got: error,
                }),
                _ => Ok(()),
            };
        }
        Err(error) => return Err(CaseFailure::Invalid(error)),
    };
    let decision = match &request {
        Ask::Spawn(request) => evaluate(policy, request, &case.usage),
        Ask::Message(request) => evaluate_message(policy, request),
    };
    let effect = match decision.effect {
        Effect::Allow => Expect::Allow,
        Effect::Deny => Expect::Deny,
    };
    let rules = || {
        decision
            .rules
            .iter()
            .map(|r| r.as_str().to_owned())
            .collect()
    };
    if effect != case.expect {
        return Err(CaseFailure::Effect {
            expected: case.expect,
            got: effect,
            rules: rules(),
            reasons: decision.reasons.clone(),
        });
    }
    if let Some(rule) = &case.rule
        && !decision.rules.iter().any(|r| r.as_str() == rule)
    {
        return Err(CaseFailure::Rule {
            expected: rule.clone(),
            decided: rules(),
        });
    }
    Ok(())
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(1, |b| b.matches('\n').count() + 1)
}

//! Policy diagnostics: where (file, span → line:column), how bad, what, and how to fix it; and
//! their renderings as text (with the source line and a caret), JSON and SARIF 2.1.0.

use std::fmt::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// How bad a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The policy is invalid.
    Error,
    /// Valid, but a reviewer should look (`--deny-warnings` makes it fail).
    Warning,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// One problem in one policy file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// A stable identifier (`unknown-key`, `duplicate-id`, …): the SARIF rule id.
    pub code: &'static str,
    /// The file.
    pub path: PathBuf,
    /// 1-based line and column (in characters) of the span's start.
    pub line: usize,
    /// See `line`.
    pub column: usize,
    /// 1-based line and column just past the span's end.
    pub end_line: usize,
    /// See `end_line`.
    pub end_column: usize,
    /// What is wrong.
    pub message: String,
    /// How to fix it, when that helps.
    pub help: Option<String>,
    /// The source line the span starts on (rendered through the scrubber by the CLI).
    source_line: String,
    /// How many characters of `source_line` the caret underlines.
    width: usize,
}

impl Diagnostic {
    /// A diagnostic for `span` of `text`, read from `path`.
    pub fn new(
        severity: Severity,
        code: &'static str,
        path: &Path,
        text: &str,
        span: Range<usize>,
        message: impl Into<String>,
    ) -> Self {
        let (line, column, line_start) = position(text, span.start);
        let (end_line, end_column, _) = position(text, span.end.max(span.start));
        let line_end = text
            .get(line_start..)
            .and_then(|rest| rest.find('\n'))
            .map_or(text.len(), |n| line_start + n);
        let source_line = text
            .get(line_start..line_end)
            .unwrap_or_default()
            .trim_end_matches('\r')
            .to_owned();
        let width = if end_line == line {
            end_column.saturating_sub(column).max(1)
        } else {
            source_line
                .chars()
                .count()
                .saturating_sub(column - 1)
                .max(1)
        };
        Diagnostic {
            severity,
            code,
            path: path.to_owned(),
            line,
            column,
            end_line,
            end_column,
            message: message.into(),
            help: None,
            source_line,
            width,
        }
    }

    /// Adds a `help:` line.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// `file:line:column: error: message`, the source line, a caret under the span, and help.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{}:{}:{}: {}: {}\n",
            self.path.display(),
            self.line,
            self.column,
            self.severity.as_str(),
            self.message
        );
        let number = self.line.to_string();
        let pad = " ".repeat(number.len());
        let _ = writeln!(out, "{number} | {}", self.source_line);
        let _ = writeln!(
            out,
            "{pad} | {}{}",
            " ".repeat(self.column - 1),
            "^".repeat(self.width)
        );
        if let Some(help) = &self.help {
            let _ = writeln!(out, "{pad} = help: {help}");
        }
        out
    }

    fn to_json(&self) -> Value {
        json!({
            "file": self.path.display().to_string(),
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "severity": self.severity.as_str(),
            "code": self.code,
            "message": self.message,
            "help": self.help,
        })
    }
}

/// 1-based (line, column in characters) of byte `offset`, and the byte where its line starts.
fn position(text: &str, offset: usize) -> (usize, usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or_default();
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column, line_start)
}

/// Diagnostics as one JSON document: `{"valid": bool, "errors": n, "warnings": n, "diagnostics": […]}`.
pub fn to_json(diagnostics: &[Diagnostic]) -> Value {
    let errors = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    json!({
        "valid": errors == 0,
        "errors": errors,
        "warnings": diagnostics.len() - errors,
        "diagnostics": diagnostics.iter().map(Diagnostic::to_json).collect::<Vec<_>>(),
    })
}

/// Diagnostics as a SARIF 2.1.0 log (for code scanning in CI).
pub fn to_sarif(diagnostics: &[Diagnostic]) -> Value {
    let mut codes: Vec<&str> = diagnostics.iter().map(|d| d.code).collect();
    codes.sort_unstable();
    codes.dedup();
    let rules: Vec<Value> = codes
        .iter()
        .map(|code| json!({"id": code, "shortDescription": {"text": rule_text(code)}}))
        .collect();
    let results: Vec<Value> = diagnostics
        .iter()
        .map(|d| {
            let mut text = d.message.clone();
            if let Some(help) = &d.help {
                text.push_str(&format!(" (help: {help})"));
            }
            json!({
                "ruleId": d.code,
                "ruleIndex": codes.iter().position(|c| *c == d.code).unwrap_or(0),
                "level": d.severity.as_str(),
                "message": {"text": text},
                "locations": [{
                    "physicalLocation": {
                        "artifactLocation": {"uri": uri(&d.path)},
                        "region": {
                            "startLine": d.line,
                            "startColumn": d.column,
                            "endLine": d.end_line,
                            "endColumn": d.end_column,
                        }
                    }
                }]
            })
        })
        .collect();
    sarif_log("fleetd", rules, results)
}

/// A SARIF 2.1.0 log of one run of the policy tool `name`, with its rules and results.
pub fn sarif_log(name: &str, rules: Vec<Value>, results: Vec<Value>) -> Value {
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": name,
                "version": env!("CARGO_PKG_VERSION"),
                "informationUri": "https://github.com/fleetd/fleetd/blob/main/docs/policy.md",
                "rules": rules,
            }},
            "columnKind": "unicodeCodePoints",
            "results": results,
        }]
    })
}

/// A relative path as a SARIF URI reference (forward slashes, spaces escaped).
pub fn uri(path: &Path) -> String {
    path.to_string_lossy()
        .replace('\\', "/")
        .replace(' ', "%20")
}

fn rule_text(code: &str) -> &'static str {
    match code {
        "syntax" => "The file is not valid TOML.",
        "unknown-key" => "A key the policy format does not define.",
        "missing-key" => "A required key is missing.",
        "type" => "A value has the wrong type.",
        "invalid-value" => "A value is out of range or malformed.",
        "invalid-regex" => "A value pattern is not a valid regular expression.",
        "literal-secret" => "A policy value holds a credential; policy holds references only.",
        "duplicate-id" => "Two profiles or rules share an id.",
        "unknown-profile" => "A grant or rule names a profile no file defines.",
        "dangerous-opt-in" => "A grant lets requests set a dangerous environment variable.",
        "never-matches" => "A rule can never match a request.",
        _ => "A policy problem.",
    }
}

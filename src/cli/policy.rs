//! `fleetd policy check | explain | test | diff | schema`: for security reviewers and CI.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};

use super::policy_diff::{self, DiffFormat};
use super::policy_load::load_valid;
use super::{Output, exit};
use crate::config::Config;
use crate::policy::{
    self, Ask, Counts, Decision, Diagnostic, Effect, MAX_REQUEST, PolicySet, RequestError, Severity,
};

/// `fleetd policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Check a policy directory; report every problem (exit 0 valid, 3 invalid, 2 unreadable).
    Check {
        /// The directory (default: the configured policy directory).
        dir: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Treat warnings as errors.
        #[arg(long)]
        deny_warnings: bool,
    },
    /// Decide one spawn request or message and show why (exit 0 allow, 1 deny, 2 invalid request, 3 invalid policy).
    Explain {
        /// The policy directory (default: the configured one).
        #[arg(long, value_name = "DIR")]
        policy: Option<PathBuf>,
        /// The request as JSON (`-` for stdin): a spawn request, or `{"kind": "message", "origin": {…}, "profile": P, "sender": "spawner"|"spawned"|"other"}`.
        request: PathBuf,
        /// Counts to check limits against, as JSON: {"running": N, "origin_running": N, "recent": N}.
        #[arg(long, value_name = "JSON")]
        usage: Option<String>,
    },
    /// Run the policy's test cases in DIR/tests/*.toml (exit 0 all pass, 1 a failure, 3 invalid policy).
    Test {
        /// The directory (default: the configured policy directory).
        dir: Option<PathBuf>,
    },
    /// What a policy change grants, by origin and profile (exit 0 nothing widens, 1 something
    /// widens, 3 a side is invalid, 2 a side cannot be read).
    Diff {
        /// The old policy directory; with `--git`, the policy directory (default: `policy` in the
        /// current directory when there is one, else the configured one).
        old: Option<PathBuf>,
        /// The new policy directory.
        new: Option<PathBuf>,
        /// Compare the policy directory at two revisions: `REV..REV`, or `REV` against the work
        /// tree; alone, the merge base with the default branch against the work tree.
        #[arg(long, value_name = "REV[..REV]", num_args = 0..=1, default_missing_value = "")]
        git: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = DiffFormat::Text)]
        format: DiffFormat,
    },
    /// Print the JSON Schema of a policy file.
    Schema,
}

/// `policy check` output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// `file:line:column: error: message`, the source line and a caret.
    Text,
    /// One JSON document.
    Json,
    /// SARIF 2.1.0, for code scanning.
    Sarif,
}

pub(super) fn run(command: &PolicyCommand, config: Option<&Path>, out: &Output) -> ExitCode {
    match command {
        PolicyCommand::Check {
            dir,
            format,
            deny_warnings,
        } => with_dir(dir.as_deref(), config, out, |dir| {
            check(dir, *format, *deny_warnings, out)
        }),
        PolicyCommand::Explain {
            policy,
            request,
            usage,
        } => with_dir(policy.as_deref(), config, out, |dir| {
            explain(dir, request, usage.as_deref(), out)
        }),
        PolicyCommand::Test { dir } => with_dir(dir.as_deref(), config, out, |dir| test(dir, out)),
        PolicyCommand::Diff {
            old,
            new,
            git,
            format,
        } => diff(
            old.as_deref(),
            new.as_deref(),
            git.as_deref(),
            *format,
            config,
            out,
        ),
        PolicyCommand::Schema => {
            out.line(&pretty(&policy::json_schema()));
            exit::code(exit::OK)
        }
    }
}

/// Runs `f` on the given directory, or the configured one.
fn with_dir(
    dir: Option<&Path>,
    config: Option<&Path>,
    out: &Output,
    f: impl FnOnce(&Path) -> ExitCode,
) -> ExitCode {
    if let Some(dir) = dir {
        return f(dir);
    }
    match Config::load(config) {
        Ok(config) => f(&config.paths.policy),
        Err(error) => {
            out.error(&error);
            exit::code(exit::USAGE)
        }
    }
}

fn diff(
    old: Option<&Path>,
    new: Option<&Path>,
    git: Option<&str>,
    format: DiffFormat,
    config: Option<&Path>,
    out: &Output,
) -> ExitCode {
    match (git, old, new) {
        (None, Some(old), Some(new)) => policy_diff::run_dirs(old, new, format, out),
        (Some(range), dir, None) => {
            // In a repository the policy is usually `policy/` beside the caller (as shipped).
            let here = PathBuf::from("policy");
            let dir = match dir {
                Some(dir) => dir.to_owned(),
                None if here.is_dir() => here,
                None => Config::load(config).map(|c| c.paths.policy).unwrap_or(here),
            };
            policy_diff::run_git(&dir, range, format, out)
        }
        _ => {
            out.note("error: `policy diff` takes OLD NEW, or --git [REV[..REV]] [DIR]");
            exit::code(exit::USAGE)
        }
    }
}

fn check(dir: &Path, format: Format, deny_warnings: bool, out: &Output) -> ExitCode {
    let (result, diagnostics) = policy::load_dir(dir);
    if let Err(policy::LoadError::Read { .. }) = &result {
        if let Err(error) = &result {
            out.error(error);
        }
        return exit::code(exit::USAGE);
    }
    let warnings = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Warning)
        .count();
    let failed = result.is_err() || (deny_warnings && warnings > 0);
    match format {
        Format::Json => out.line(&pretty(&policy::to_json(&diagnostics))),
        Format::Sarif => out.line(&pretty(&policy::to_sarif(&diagnostics))),
        Format::Text => {
            for diagnostic in &diagnostics {
                out.line(&diagnostic.render());
            }
            out.line(&summary(dir, result.as_ref().ok(), &diagnostics));
        }
    }
    exit::code(if failed {
        exit::POLICY_INVALID
    } else {
        exit::OK
    })
}

fn summary(dir: &Path, set: Option<&PolicySet>, diagnostics: &[Diagnostic]) -> String {
    let errors = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let warnings = diagnostics.len() - errors;
    match set {
        Some(set) => format!(
            "{}: policy ok: {} profile(s), {} grant(s), {} deny rule(s), {} message rule(s); {warnings} warning(s)",
            dir.display(),
            set.profiles.len(),
            set.grants.len(),
            set.denies.len(),
            set.messages.len()
        ),
        None => format!(
            "{}: policy invalid: {errors} error(s), {warnings} warning(s)",
            dir.display()
        ),
    }
}

fn explain(dir: &Path, request_path: &Path, usage: Option<&str>, out: &Output) -> ExitCode {
    let policy = match load_valid(dir, out) {
        Ok(policy) => policy,
        Err(code) => return code,
    };
    let bytes = match read_request(request_path) {
        Ok(bytes) => bytes,
        Err(message) => {
            out.note(&format!("error: {message}"));
            return exit::code(exit::USAGE);
        }
    };
    let parsed = serde_json::from_slice::<serde_json::Value>(&bytes)
        .map_err(|e| RequestError {
            field: "request".to_owned(),
            message: format!("not valid JSON (line {}, column {})", e.line(), e.column()),
        })
        .and_then(|value| Ask::from_value(&value));
    let request = match parsed {
        Ok(Ask::Spawn(request)) => request,
        Ok(Ask::Message(message)) => {
            let decision = policy::evaluate_message(&policy, &message);
            return decided(&decision, None, out);
        }
        Err(error) => {
            out.note(&format!("error: invalid request: {error}"));
            return exit::code(exit::USAGE);
        }
    };
    let counts: Counts = match usage.map(serde_json::from_str).transpose() {
        Ok(counts) => counts.unwrap_or_default(),
        Err(_) => {
            out.note(
                "error: `--usage` must be {\"running\": N, \"origin_running\": N, \"recent\": N}",
            );
            return exit::code(exit::USAGE);
        }
    };
    let mut decision = policy::evaluate(&policy, &request, &counts);
    let mut spec = None;
    if decision.effect == Effect::Allow {
        // An allow that cannot become a pane spec on this host is a deny, as in the daemon.
        match policy::pane_spec(&policy, &request, &decision) {
            Ok(built) => spec = Some(built.to_json()),
            Err(error) => {
                decision.effect = Effect::Deny;
                decision.reasons.push(error.to_string());
            }
        }
    }
    decided(&decision, spec, out)
}

/// Prints a decision (and the pane spec an allowed spawn would get); exit 0 allow, 1 deny.
fn decided(decision: &Decision, spec: Option<serde_json::Value>, out: &Output) -> ExitCode {
    let mut json = serde_json::json!({
        "effect": decision.effect,
        "rules": decision.rules,
        "reasons": decision.reasons,
    });
    if let (Some(spec), Some(object)) = (spec, json.as_object_mut()) {
        object.insert("pane".to_owned(), spec);
    }
    out.line(&pretty(&json));
    exit::code(if decision.effect == Effect::Allow {
        exit::OK
    } else {
        exit::FAILED
    })
}

/// Reads at most [`MAX_REQUEST`] bytes; more is refused, never truncated.
fn read_request(path: &Path) -> Result<Vec<u8>, String> {
    let limit = u64::try_from(MAX_REQUEST).unwrap_or(u64::MAX) + 1;
    let mut bytes = Vec::new();
    let read = if path == Path::new("-") {
        std::io::stdin().lock().take(limit).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(limit).read_to_end(&mut bytes))
    };
    read.map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    if bytes.len() > MAX_REQUEST {
        return Err(format!(
            "invalid request: `request`: larger than {MAX_REQUEST} bytes"
        ));
    }
    Ok(bytes)
}

fn test(dir: &Path, out: &Output) -> ExitCode {
    let policy = match load_valid(dir, out) {
        Ok(policy) => policy,
        Err(code) => return code,
    };
    match policy::testcase::run(&policy, dir) {
        Ok(report) => {
            for failure in &report.failures {
                out.line(&format!("FAIL {failure}"));
            }
            out.line(&format!(
                "{} passed, {} failed",
                report.passed,
                report.failures.len()
            ));
            exit::code(if report.failures.is_empty() {
                exit::OK
            } else {
                exit::FAILED
            })
        }
        Err(error) => {
            out.error(&error);
            exit::code(exit::USAGE)
        }
    }
}

fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

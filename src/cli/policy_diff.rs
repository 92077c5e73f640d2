//! `fleetd policy diff OLD NEW` / `--git [REV[..REV]]`: what a policy change grants, as text,
//! JSON, Markdown (a pull-request comment) or SARIF. Exit 0 when nothing widens, 1 when
//! something does, 3 when either side is invalid, 2 when a side cannot be read.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use clap::ValueEnum;
use serde_json::{Value, json};

use super::{Output, exit};
use crate::policy::diff::{Direction, Finding, Report, Subject};
use crate::policy::{self, PolicySet};

/// `policy diff` output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    /// Grouped by origin and profile, one line per finding.
    Text,
    /// One JSON document.
    Json,
    /// A pull-request comment.
    Markdown,
    /// SARIF 2.1.0, each finding at the line of NEW that causes it.
    Sarif,
}

/// Why a side of the comparison could not be had from git.
#[derive(Debug, thiserror::Error)]
pub(super) enum GitError {
    /// git could not be run.
    #[error("cannot run git: {0}")]
    Spawn(#[source] std::io::Error),
    /// git ran and refused.
    #[error("git {command} failed: {stderr}")]
    Failed {
        /// The git subcommand.
        command: String,
        /// What git said.
        stderr: String,
    },
    /// No default branch to take the merge base with.
    #[error(
        "no default branch found (tried origin/HEAD, main, master); name the revisions: --git REV..REV"
    )]
    NoDefaultBranch,
    /// A temporary directory for a revision's files.
    #[error("cannot extract revision `{rev}`: {source}")]
    Extract {
        /// The revision.
        rev: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// One side of the comparison: a directory to load, and how to name its files in findings.
struct Side {
    dir: PathBuf,
    /// `(extracted prefix, repository path)`: paths under the first are shown as the second.
    rename: Option<(PathBuf, PathBuf)>,
    /// Owns the extracted files until the diff is done.
    _temp: Option<TempDir>,
    /// The revision did not have the directory: an empty policy.
    absent: bool,
    label: String,
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn run_dirs(old: &Path, new: &Path, format: DiffFormat, out: &Output) -> ExitCode {
    let side = |dir: &Path| Side {
        dir: dir.to_owned(),
        rename: None,
        _temp: None,
        absent: false,
        label: dir.display().to_string(),
    };
    compare(&side(old), &side(new), format, out)
}

pub(super) fn run_git(dir: &Path, range: &str, format: DiffFormat, out: &Output) -> ExitCode {
    let sides = git_sides(dir, range);
    match sides {
        Ok((old, new)) => compare(&old, &new, format, out),
        Err(error) => {
            out.error(&error);
            exit::code(exit::USAGE)
        }
    }
}

fn git(dir: &Path, args: &[&str]) -> Result<String, GitError> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(GitError::Spawn)?;
    if !output.status.success() {
        return Err(GitError::Failed {
            command: args.first().copied().unwrap_or_default().to_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The two sides of `--git RANGE` for the policy directory `dir` (inside a repository).
fn git_sides(dir: &Path, range: &str) -> Result<(Side, Side), GitError> {
    let prefix = PathBuf::from(git(dir, &["rev-parse", "--show-prefix"])?);
    let root = PathBuf::from(git(dir, &["rev-parse", "--show-toplevel"])?);
    let (old_rev, new_rev) = match range.split_once("..") {
        Some((a, b)) => (a.to_owned(), Some(b.to_owned())),
        None if !range.is_empty() => (range.to_owned(), None),
        None => (default_base(dir)?, None),
    };
    let old = extract(&root, &prefix, &old_rev)?;
    let new = match new_rev {
        Some(rev) => extract(&root, &prefix, &rev)?,
        None => Side {
            dir: dir.to_owned(),
            rename: None,
            _temp: None,
            absent: false,
            label: format!("{} (work tree)", dir.display()),
        },
    };
    Ok((old, new))
}

/// The merge base of HEAD with the default branch.
fn default_base(dir: &Path) -> Result<String, GitError> {
    let branch = [
        "origin/HEAD",
        "origin/main",
        "main",
        "origin/master",
        "master",
    ]
    .into_iter()
    .find(|b| git(dir, &["rev-parse", "--verify", "--quiet", b]).is_ok())
    .ok_or(GitError::NoDefaultBranch)?;
    git(dir, &["merge-base", "HEAD", branch])
}

/// The policy directory at `rev`, extracted to a temporary directory.
fn extract(root: &Path, prefix: &Path, rev: &str) -> Result<Side, GitError> {
    let failed = |source| GitError::Extract {
        rev: rev.to_owned(),
        source,
    };
    // The revision must exist; only the directory may be missing from it.
    git(
        root,
        &["rev-parse", "--verify", &format!("{rev}^{{commit}}")],
    )?;
    let temp = TempDir(private_dir().map_err(failed)?);
    let spec = format!("{rev}:{}", prefix.display());
    let tree = git(root, &["rev-parse", "--verify", "--quiet", &spec]);
    let dir = temp.0.join(prefix);
    let label = format!("{} at {rev}", prefix.display());
    if tree.is_err() {
        // The directory did not exist at that revision: nothing was granted.
        return Ok(Side {
            dir,
            rename: None,
            _temp: Some(temp),
            absent: true,
            label,
        });
    }
    let mut archive = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["archive", "--format=tar", rev, "--"])
        .arg(prefix)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(GitError::Spawn)?;
    let Some(stdout) = archive.stdout.take() else {
        return Err(failed(std::io::Error::other("no archive output")));
    };
    let untar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&temp.0)
        .stdin(stdout)
        .status();
    let archived = archive.wait_with_output().map_err(failed)?;
    if !archived.status.success() {
        return Err(GitError::Failed {
            command: "archive".to_owned(),
            stderr: String::from_utf8_lossy(&archived.stderr).trim().to_owned(),
        });
    }
    let status = untar.map_err(failed)?;
    if !status.success() {
        return Err(failed(std::io::Error::other(format!(
            "tar exited {status}"
        ))));
    }
    // The loader refuses group- or world-writable policy files, as the daemon would; what git
    // wrote is ours alone.
    restrict(&temp.0).map_err(failed)?;
    Ok(Side {
        rename: Some((temp.0.clone(), PathBuf::new())),
        dir,
        _temp: Some(temp),
        absent: false,
        label,
    })
}

/// A new directory only this user can enter, under the temporary directory, with a random
/// name (created, never reused: a path someone else made first is an error).
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
    let name: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let path = std::env::temp_dir().join(format!("fleetd-policy-diff-{name}"));
    std::fs::DirBuilder::new().mode(0o700).create(&path)?;
    Ok(path)
}

/// Takes group and world write permission off everything under `dir`.
fn restrict(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o755;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        if meta.is_dir() {
            restrict(&path)?;
        }
    }
    Ok(())
}

/// Loads one side; an invalid side prints its diagnostics and which side it is.
fn load(side: &Side, out: &Output) -> Result<PolicySet, ExitCode> {
    if side.absent {
        return Ok(PolicySet::default());
    }
    super::policy_load::load_valid(&side.dir, out)
        .inspect_err(|_| out.note(&format!("  in the policy of {}", side.label)))
}

fn compare(old: &Side, new: &Side, format: DiffFormat, out: &Output) -> ExitCode {
    let (before, after) = match (load(old, out), load(new, out)) {
        (Ok(before), Ok(after)) => (before, after),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    let mut report = policy::diff::diff(&before, &after);
    if let Some((from, to)) = &new.rename {
        for finding in &mut report.findings {
            if let Some(location) = &mut finding.location
                && let Ok(rest) = location.file.strip_prefix(from)
            {
                location.file = to.join(rest);
            }
        }
    }
    let title = format!("{} → {}", old.label, new.label);
    let text = match format {
        DiffFormat::Text => text(&report, &title),
        DiffFormat::Json => pretty(&to_json(&report)),
        DiffFormat::Markdown => markdown(&report, &title),
        DiffFormat::Sarif => pretty(&to_sarif(&report)),
    };
    out.line(text.trim_end());
    exit::code(if report.widens() {
        exit::FAILED
    } else {
        exit::OK
    })
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// `(widened, changed, narrowed)`.
fn counts(report: &Report) -> (usize, usize, usize) {
    let count = |d: Direction| report.findings.iter().filter(|f| f.direction == d).count();
    (
        count(Direction::Widened),
        count(Direction::Changed),
        count(Direction::Narrowed),
    )
}

fn summary(report: &Report) -> String {
    let (widened, changed, narrowed) = counts(report);
    let verdict = if report.widens() {
        "something widens"
    } else {
        "nothing widens"
    };
    format!("{widened} widened, {changed} changed, {narrowed} narrowed: {verdict}")
}

/// What a finding is about, for people (names in backticks: never `NAME: value`).
fn subject(subject: &Subject) -> String {
    match subject {
        Subject::Access => "access".to_owned(),
        Subject::Variable(name) => format!("env `{name}`"),
        Subject::Cwd => "cwd".to_owned(),
        Subject::MaxConcurrent => "max_concurrent".to_owned(),
        Subject::Rate => "rate".to_owned(),
        Subject::MaxInstances => "max_instances".to_owned(),
        Subject::Argv => "argv".to_owned(),
        Subject::Roots => "roots".to_owned(),
        Subject::FixedEnv(name) => format!("fixed env `{name}`"),
        Subject::Secret(name) => format!("secret `{name}`"),
        Subject::Readiness => "readiness".to_owned(),
        Subject::MaySpawn => "may_spawn".to_owned(),
        Subject::RemoteMessages => "remote_messages".to_owned(),
        Subject::Sandbox => "sandbox".to_owned(),
        Subject::Message(sender) => format!("messages, sender {sender}"),
    }
}

fn where_(finding: &Finding) -> String {
    finding
        .location
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// Findings in runs of the same scope.
fn groups(report: &Report) -> Vec<&[Finding]> {
    report
        .findings
        .chunk_by(|a, b| a.scope == b.scope)
        .collect()
}

fn heading(group: &[Finding]) -> String {
    let Some(first) = group.first() else {
        return String::new();
    };
    let holders = &first.holders;
    if first.scope.fleet.is_none() && !holders.is_empty() {
        format!("{} (held by {})", first.scope, holders.join(", "))
    } else if first.scope.fleet.is_none() {
        format!("{} (no origin holds it)", first.scope)
    } else {
        first.scope.to_string()
    }
}

fn text(report: &Report, title: &str) -> String {
    let mut out = format!("policy diff {title}: {}\n", summary(report));
    for group in groups(report) {
        out.push_str(&format!("\n{}\n", heading(group)));
        for finding in group {
            let example = finding
                .example
                .as_ref()
                .map(|e| format!(" — e.g. {e:?}"))
                .unwrap_or_default();
            out.push_str(&format!(
                "  {:<8} {} — {}{example}  [{}]\n",
                finding.direction.as_str(),
                subject(&finding.subject),
                finding.message,
                where_(finding)
            ));
        }
    }
    out
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn markdown(report: &Report, title: &str) -> String {
    let mut out = format!(
        "### fleetd policy diff\n\n`{}`: {}\n",
        cell(title),
        summary(report)
    );
    if report.widens() {
        out.push_str("\n**This change grants more: it needs a security review.**\n");
    }
    for group in groups(report) {
        out.push_str(&format!(
            "\n#### {}\n\n| | what | change | example | where |\n|---|---|---|---|---|\n",
            cell(&heading(group))
        ));
        for finding in group {
            let direction = if finding.direction.widens() {
                format!("**{}**", finding.direction.as_str())
            } else {
                finding.direction.as_str().to_owned()
            };
            let example = finding
                .example
                .as_ref()
                .map(|e| format!("`{}`", cell(&format!("{e:?}"))))
                .unwrap_or_default();
            out.push_str(&format!(
                "| {direction} | {} | {} | {example} | {} |\n",
                cell(&subject(&finding.subject)),
                cell(&finding.message),
                cell(&where_(finding))
            ));
        }
    }
    out
}

fn to_json(report: &Report) -> Value {
    let (widened, changed, narrowed) = counts(report);
    let findings: Vec<Value> = report
        .findings
        .iter()
        .map(|f| {
            let mut value = serde_json::to_value(f).unwrap_or(Value::Null);
            if let (Some(object), Some(location)) = (value.as_object_mut(), &f.location) {
                object.insert(
                    "location".to_owned(),
                    json!({"file": location.file.display().to_string(), "line": location.line}),
                );
            }
            value
        })
        .collect();
    json!({
        "widens": report.widens(),
        "summary": {"widened": widened, "changed": changed, "narrowed": narrowed},
        "findings": findings,
    })
}

/// The SARIF rule id of a finding: its direction and what it is about.
fn rule_id(finding: &Finding) -> String {
    let kind = match &finding.subject {
        Subject::Variable(_) => "env",
        Subject::FixedEnv(_) => "fixed-env",
        Subject::Secret(_) => "secret",
        Subject::Message(_) => "message",
        Subject::Access => "access",
        Subject::Cwd => "cwd",
        Subject::MaxConcurrent => "max-concurrent",
        Subject::Rate => "rate",
        Subject::MaxInstances => "max-instances",
        Subject::Argv => "argv",
        Subject::Roots => "roots",
        Subject::Readiness => "readiness",
        Subject::MaySpawn => "may-spawn",
        Subject::RemoteMessages => "remote-messages",
        Subject::Sandbox => "sandbox",
    };
    format!("policy-diff/{}/{kind}", finding.direction.as_str())
}

fn to_sarif(report: &Report) -> Value {
    let mut ids: Vec<String> = report.findings.iter().map(rule_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let rules: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id": id, "shortDescription": {"text": format!("A policy change: {id}")}}))
        .collect();
    let results: Vec<Value> = report
        .findings
        .iter()
        .map(|f| {
            let id = rule_id(f);
            let locations: Vec<Value> = f
                .location
                .iter()
                .map(|l| {
                    json!({"physicalLocation": {
                        "artifactLocation": {"uri": policy::sarif_uri(&l.file)},
                        "region": {"startLine": l.line},
                    }})
                })
                .collect();
            let example = f
                .example
                .as_ref()
                .map(|e| format!(" (e.g. {e:?})"))
                .unwrap_or_default();
            json!({
                "ruleId": id,
                "ruleIndex": ids.iter().position(|i| *i == id).unwrap_or(0),
                "level": if f.direction.widens() { "warning" } else { "note" },
                "message": {"text": format!("{} — {} — {}{example}", f.scope, subject(&f.subject), f.message)},
                "locations": locations,
            })
        })
        .collect();
    policy::sarif_log("fleetd policy diff", rules, results)
}

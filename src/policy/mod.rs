//! The spawn policy: which origin fleets and hosts may ask this host to launch which profiles,
//! with which environment. Deny by default; a matching deny beats any grant.
//!
//! A directory of TOML files parses (with spans, every problem reported) into checked types —
//! [`PolicySet`] — which is all the daemon sees. [`evaluate`] is pure: a request, the counts it
//! is checked against, and the policy give a [`Decision`] that names the rules that made it.
//!
//! Imports: `scrub` (its detector refuses literal secrets in policy values).

mod diag;
pub mod diff;
mod eval;
mod lang;
mod message;
mod model;
mod names;
mod parse;
mod request;
mod schema;
mod spec;
pub mod testcase;

#[cfg(test)]
mod message_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

pub use diag::{Diagnostic, Severity, sarif_log, to_json, to_sarif, uri as sarif_uri};
pub use eval::{Counts, DEFAULT_DENY, Decision, Effect, GrantRefusal, Usage, evaluate};
pub use message::{
    Ask, MessageRequest, NO_REMOTE_TEXT, SPAWNED, SPAWNER, Sender, evaluate_message,
};
pub use model::{
    Confinement, Deny, EnvRule, Grant, Location, MAILBOX, MessageGrant, Network, PolicySet,
    Profile, Rate, Readiness, RuleId, Sandbox, SecretRef,
};
pub use names::{DANGEROUS, FLEETD_PLACES, dangerous, fleetd_place};
pub use request::{MAX_REQUEST, Origin, Request, RequestError};
pub use schema::json_schema;
pub use spec::{PaneSpec, SpecError, pane_spec};

/// The policy in force, shared by whoever decides with it (the daemon's spawn path, the
/// courier's intake of messages); replaced whole when it is reloaded.
#[derive(Clone, Debug, Default)]
pub struct Current(std::sync::Arc<std::sync::RwLock<std::sync::Arc<PolicySet>>>);

impl Current {
    /// Shares `set`.
    pub fn new(set: PolicySet) -> Current {
        Current(std::sync::Arc::new(std::sync::RwLock::new(
            std::sync::Arc::new(set),
        )))
    }

    /// The policy in force.
    pub fn get(&self) -> std::sync::Arc<PolicySet> {
        std::sync::Arc::clone(
            &self
                .0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Puts `set` in force.
    pub fn replace(&self, set: PolicySet) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = std::sync::Arc::new(set);
    }
}

/// Errors from loading a policy directory.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The directory or one of its files could not be read.
    #[error("cannot read `{}`", .path.display())]
    Read {
        /// What could not be read.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Some files have errors; the diagnostics are returned next to this error, not inside it.
    #[error("{count} policy error(s)")]
    Invalid {
        /// How many errors.
        count: usize,
    },
}

/// Loads every `*.toml` file directly in `dir` (sorted by name; `tests/` is for `policy test`).
///
/// Returns the checked set, or why not, and every diagnostic (warnings come with a valid set).
pub fn load_dir(dir: &Path) -> (Result<PolicySet, LoadError>, Vec<Diagnostic>) {
    let (files, problems) = match policy_entries(dir) {
        Ok(read) => read,
        Err(source) => {
            return (
                Err(LoadError::Read {
                    path: dir.to_owned(),
                    source,
                }),
                Vec::new(),
            );
        }
    };
    let mut sources = Vec::with_capacity(files.len());
    for path in files {
        match read_limited(&path) {
            Ok(text) => sources.push((path, text)),
            Err(source) => return (Err(LoadError::Read { path, source }), Vec::new()),
        }
    }
    let (loaded, mut diagnostics) = load_sources(&sources);
    if problems.is_empty() {
        return (loaded, diagnostics);
    }
    let errors = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let count = errors + problems.len();
    diagnostics.splice(0..0, problems);
    (Err(LoadError::Invalid { count }), diagnostics)
}

/// Loads policy from `(path, text)` pairs, as if they were the files of one directory.
pub fn load_sources(
    sources: &[(PathBuf, String)],
) -> (Result<PolicySet, LoadError>, Vec<Diagnostic>) {
    let mut diagnostics = Vec::new();
    let mut set = PolicySet::default();
    let mut profile_sites: BTreeMap<String, (PathBuf, String, std::ops::Range<usize>)> =
        BTreeMap::new();
    let mut rule_sites: BTreeMap<String, Location> = BTreeMap::new();
    let mut grant_profiles = Vec::new();
    let mut defined = std::collections::BTreeSet::new();
    for (path, text) in sources {
        let items = parse::parse_file(path, text, &mut diagnostics);
        grant_profiles.push((path.as_path(), text.as_str(), items.profile_refs));
        defined.extend(items.profile_names);
        for (profile, span) in items.profiles {
            let first = profile_sites
                .get(&profile.name)
                .map(|(p, _, _)| p.display().to_string());
            if let Some(first) = first {
                let message = format!("profile `{}` is defined twice", profile.name);
                diagnostics.push(duplicate(
                    path,
                    text,
                    span,
                    message,
                    format!("first defined in {first}"),
                ));
                continue;
            }
            profile_sites.insert(profile.name.clone(), (path.clone(), text.clone(), span));
            set.profiles.insert(profile.name.clone(), profile);
        }
        for (grant, spans) in items.grants {
            if let Some(d) = claim_rule_id(
                &mut rule_sites,
                &grant.id,
                &grant.location,
                path,
                text,
                spans.id,
            ) {
                diagnostics.push(d);
                continue;
            }
            set.grants.push(grant);
        }
        for (rule, span) in items.messages {
            if let Some(d) =
                claim_rule_id(&mut rule_sites, &rule.id, &rule.location, path, text, span)
            {
                diagnostics.push(d);
                continue;
            }
            set.messages.push(rule);
        }
        for (deny, span) in items.denies {
            if let Some(d) =
                claim_rule_id(&mut rule_sites, &deny.id, &deny.location, path, text, span)
            {
                diagnostics.push(d);
                continue;
            }
            set.denies.push(deny);
        }
    }
    cross_checks(&set, &defined, &grant_profiles, sources, &mut diagnostics);
    diagnostics.sort_by(|a, b| (&a.path, a.line, a.column).cmp(&(&b.path, b.line, b.column)));
    let count = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    if count > 0 {
        return (Err(LoadError::Invalid { count }), diagnostics);
    }
    (Ok(set), diagnostics)
}

/// The ids of built-in rules, which a policy's rules may not take.
const BUILT_IN_RULES: &[&str] = &[DEFAULT_DENY, NO_REMOTE_TEXT, SPAWNER, SPAWNED];

/// Records `id` as used at `location`; a diagnostic when it was used before.
fn claim_rule_id(
    sites: &mut BTreeMap<String, Location>,
    id: &RuleId,
    location: &Location,
    path: &Path,
    text: &str,
    span: std::ops::Range<usize>,
) -> Option<Diagnostic> {
    if let Some(first) = sites.get(id.as_str()) {
        let message = format!("rule id `{id}` is used twice");
        return Some(duplicate(
            path,
            text,
            span,
            message,
            format!("first used at {first}"),
        ));
    }
    sites.insert(id.as_str().to_owned(), location.clone());
    None
}

fn duplicate(
    path: &Path,
    text: &str,
    span: std::ops::Range<usize>,
    message: String,
    help: String,
) -> Diagnostic {
    Diagnostic::new(Severity::Error, "duplicate-id", path, text, span, message).with_help(help)
}

/// The profile names one file's grants refer to.
type ProfileRefs<'a> = (&'a Path, &'a str, Vec<parse::Named>);

/// Checks across files: grants naming unknown profiles, rules that can never match.
fn cross_checks(
    set: &PolicySet,
    defined: &std::collections::BTreeSet<String>,
    grant_profiles: &[ProfileRefs<'_>],
    sources: &[(PathBuf, String)],
    diagnostics: &mut Vec<Diagnostic>,
) {
    for (path, text, profiles) in grant_profiles {
        for (name, span) in profiles {
            if !defined.contains(name) {
                let mut d = Diagnostic::new(
                    Severity::Error,
                    "unknown-profile",
                    path,
                    text,
                    span.clone(),
                    format!("no policy file defines profile `{name}`"),
                );
                if let Some(close) = names::did_you_mean(name, defined.iter().map(String::as_str)) {
                    d = d.with_help(format!("did you mean `{close}`?"));
                }
                diagnostics.push(d);
            }
        }
    }
    let text_of = |file: &Path| {
        sources
            .iter()
            .find(|(p, _)| p == file)
            .map(|(_, t)| t.as_str())
            .unwrap_or_default()
    };
    for profile in set.profiles.values() {
        for name in profile.may_spawn.iter().filter(|n| !defined.contains(*n)) {
            let text = text_of(&profile.location.file);
            let start = line_offset(text, profile.location.line);
            let end = text
                .get(start..)
                .and_then(|r| r.find('\n'))
                .map_or(text.len(), |n| start + n);
            diagnostics.push(Diagnostic::new(
                Severity::Error,
                "unknown-profile",
                &profile.location.file,
                text,
                start..end,
                format!(
                    "profile `{}` may spawn `{name}`, which no policy file defines",
                    profile.name
                ),
            ));
        }
    }
    for grant in &set.grants {
        if grant.hosts.as_ref().is_some_and(|h| h.is_empty())
            || grant.fleets.is_empty()
            || grant.profiles.is_empty()
        {
            diagnostics.push(never(
                grant.id.as_str(),
                &grant.location,
                text_of(&grant.location.file),
                "it admits no fleet, host or profile".to_owned(),
            ));
            continue;
        }
        if let Some(deny) = set.denies.iter().find(|d| eval::deny_covers(d, grant)) {
            diagnostics.push(never(
                grant.id.as_str(),
                &grant.location,
                text_of(&grant.location.file),
                format!("deny `{}` refuses every request it could allow", deny.id),
            ));
        }
    }
    for rule in &set.messages {
        let text = text_of(&rule.location.file);
        let silent = |p: &String| set.profiles.get(p).is_some_and(|p| !p.remote_messages);
        let why = if rule.hosts.as_ref().is_some_and(|h| h.is_empty())
            || rule.fleets.is_empty()
            || rule.profiles.is_empty()
        {
            Some("it admits no fleet, host or profile".to_owned())
        } else if rule.profiles.iter().all(silent) {
            Some("its profiles never receive text from another host (an interactive shell, or `remote_messages = false`)".to_owned())
        } else {
            set.denies
                .iter()
                .find(|d| message::deny_covers(d, rule))
                .map(|deny| format!("deny `{}` refuses every message it could admit", deny.id))
        };
        if let Some(why) = why {
            diagnostics.push(never(rule.id.as_str(), &rule.location, text, why));
        }
    }
    for deny in &set.denies {
        if let Some(profiles) = &deny.profiles
            && !profiles.is_empty()
            && profiles.iter().all(|p| !set.profiles.contains_key(p))
        {
            diagnostics.push(never(
                deny.id.as_str(),
                &deny.location,
                text_of(&deny.location.file),
                "none of its profiles is defined".to_owned(),
            ));
        }
    }
}

fn never(id: &str, location: &Location, text: &str, why: String) -> Diagnostic {
    let start = line_offset(text, location.line);
    let end = text
        .get(start..)
        .and_then(|r| r.find('\n'))
        .map_or(text.len(), |n| start + n);
    Diagnostic::new(
        Severity::Warning,
        "never-matches",
        &location.file,
        text,
        start..end,
        format!("rule `{id}` can never match: {why}"),
    )
}

fn line_offset(text: &str, line: usize) -> usize {
    if line <= 1 {
        return 0;
    }
    text.match_indices('\n')
        .nth(line - 2)
        .map_or(text.len(), |(i, _)| i + 1)
}

/// Every entry of `dir` read as a reviewer reads it: the regular `*.toml` files it loads
/// (sorted), and an error diagnostic for anything else — a symlink (dangling, looping or not),
/// a FIFO, socket or device, a directory other than `tests/`, a file not named `*.toml`
/// (`.TOML` included) — and for the directory or a file that another user owns (not root, not
/// this process's user) or that group or others may write. Nothing is skipped silently: with
/// the deny file replaced by a link, the policy is invalid, not quietly weaker.
pub fn policy_entries(dir: &Path) -> io::Result<(Vec<PathBuf>, Vec<Diagnostic>)> {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    // The directory itself may be reached through a link (its target is what is checked).
    let dir_meta = std::fs::metadata(dir)?;
    if let Some(why) = unsafe_owner_or_mode(&dir_meta) {
        problems.push(entry_problem(dir, "unsafe-permissions", why));
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path)?;
        let kind = meta.file_type();
        let name = entry.file_name();
        let what = if kind.is_symlink() {
            Some("a symbolic link (policy files must be regular files in the directory)")
        } else if kind.is_dir() {
            (name != "tests").then_some("a directory other than `tests/`")
        } else if !kind.is_file() {
            Some("not a regular file (a FIFO, socket or device)")
        } else if path.extension().is_some_and(|e| e == "toml") {
            None
        } else {
            Some("not named `*.toml` (lowercase): it would not be loaded")
        };
        if let Some(what) = what {
            problems.push(entry_problem(
                &path,
                "unexpected-entry",
                format!("is {what}"),
            ));
            continue;
        }
        if let Some(why) = unsafe_owner_or_mode(&meta) {
            problems.push(entry_problem(&path, "unsafe-permissions", why));
        }
        if kind.is_file() {
            files.push(path);
        }
    }
    files.sort();
    problems.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((files, problems))
}

/// Why an entry whose metadata is `meta` may be changed by someone who must not: owned by
/// neither root nor this process's user, or writable by its group or others.
fn unsafe_owner_or_mode(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
    if uid != 0 && uid != me {
        return Some(format!(
            "is owned by uid {uid}, neither root nor fleetd's user (uid {me}): its owner controls what other hosts may run here"
        ));
    }
    let who = if mode & 0o002 != 0 {
        "world"
    } else if mode & 0o020 != 0 {
        "group"
    } else {
        return None;
    };
    Some(format!(
        "is {who}-writable (mode {mode:04o}): whoever can change it controls what other hosts may run here (`chmod go-w`)"
    ))
}

/// An error diagnostic about a whole directory entry.
fn entry_problem(path: &Path, code: &'static str, message: String) -> Diagnostic {
    Diagnostic::new(
        Severity::Error,
        code,
        path,
        "",
        0..0,
        format!("`{}` {message}", path.display()),
    )
}

/// Reads a file of at most [`parse::MAX_FILE`] bytes as UTF-8.
fn read_limited(path: &Path) -> io::Result<String> {
    let len = std::fs::metadata(path)?.len();
    if len > parse::MAX_FILE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {} bytes", parse::MAX_FILE),
        ));
    }
    let bytes = std::fs::read(path)?;
    String::from_utf8(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not valid UTF-8"))
}

//! The daemon's policy: loaded at start (an invalid one stops start-up), reloaded on SIGHUP; a bad
//! reload keeps the last good set and logs why, by file:line and message — never a value or a
//! source line.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{error, info, warn};

use crate::policy::{self, Diagnostic, LoadError, PolicySet, Severity};

/// The current policy, shared with whoever decides spawns.
#[derive(Clone, Debug)]
pub struct PolicyHandle {
    dir: PathBuf,
    current: policy::Current,
    /// Found at start, before logging exists; logged by [`PolicyHandle::log_loaded`].
    startup: Vec<Diagnostic>,
    missing: bool,
}

/// Why the policy could not be loaded at start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The directory exists but cannot be read.
    #[error("cannot read the policy directory")]
    Read(#[source] LoadError),
    /// The policy has errors; they are returned with this error.
    #[error("the policy in `{}` is invalid ({count} error(s)); fleetd will not start on it", .dir.display())]
    Invalid {
        /// The directory.
        dir: PathBuf,
        /// How many errors.
        count: usize,
        /// Every diagnostic.
        diagnostics: Vec<Diagnostic>,
    },
}

impl PolicyHandle {
    /// Loads `dir` (read strictly: see [`policy::policy_entries`]; an entry it does not load,
    /// or one another user may change, makes the policy invalid). A missing directory is an
    /// empty policy (every request denied), logged as such.
    pub fn load(dir: &Path) -> Result<PolicyHandle, StartError> {
        let (set, startup, missing) = match policy::load_dir(dir) {
            (Ok(set), diagnostics) => (set, diagnostics, false),
            (Err(LoadError::Read { source, .. }), _)
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                (PolicySet::default(), Vec::new(), true)
            }
            (Err(error @ LoadError::Read { .. }), _) => return Err(StartError::Read(error)),
            (Err(LoadError::Invalid { count }), diagnostics) => {
                return Err(StartError::Invalid {
                    dir: dir.to_owned(),
                    count,
                    diagnostics,
                });
            }
        };
        Ok(PolicyHandle {
            dir: dir.to_owned(),
            current: policy::Current::new(set),
            startup,
            missing,
        })
    }

    /// The policy in force.
    pub fn current(&self) -> Arc<PolicySet> {
        self.current.get()
    }

    /// The policy in force, for another decider to share (reloads reach it).
    pub fn shared(&self) -> policy::Current {
        self.current.clone()
    }

    /// Reloads from disk; keeps the last good set when the new one is invalid or unreadable.
    pub fn reload(&self) -> bool {
        match policy::load_dir(&self.dir) {
            (Ok(set), diagnostics) => {
                log_warnings(&diagnostics);
                summary(&set, "policy reloaded");
                self.current.replace(set);
                true
            }
            (Err(error), diagnostics) => {
                for d in diagnostics.iter().filter(|d| d.severity == Severity::Error) {
                    error!(policy.file = %d.path.display(), policy.line = d.line, policy.column = d.column, policy.code = d.code, "{}", d.message);
                }
                error!(policy.dir = %self.dir.display(), %error, "policy reload failed; keeping the last good policy");
                false
            }
        }
    }

    /// Logs what is in force, and what loading it found.
    pub fn log_loaded(&self) {
        if self.missing {
            warn!(policy.dir = %self.dir.display(), "no policy directory: every spawn request will be denied");
        }
        log_warnings(&self.startup);
        summary(&self.current(), "policy loaded");
    }
}

fn summary(set: &PolicySet, message: &str) {
    info!(
        policy.profiles = set.profiles.len(),
        policy.grants = set.grants.len(),
        policy.denies = set.denies.len(),
        policy.messages = set.messages.len(),
        "{message}"
    );
}

fn log_warnings(diagnostics: &[Diagnostic]) {
    for d in diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Warning)
    {
        warn!(policy.file = %d.path.display(), policy.line = d.line, policy.code = d.code, "{}", d.message);
    }
}

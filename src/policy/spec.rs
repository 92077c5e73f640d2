//! From an allowed request to the pane spec: argv, cwd, environment and secret references, all
//! fixed by the profile except the variables the grant let the request set. Secrets stay
//! references here; they are resolved on this host at launch.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::eval::{Decision, Effect};
use super::model::{PolicySet, Sandbox, SecretRef};
use super::request::Request;

/// What to launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaneSpec {
    /// The profile.
    pub profile: String,
    /// The command.
    pub argv: Vec<String>,
    /// The working directory, resolved (symlinks followed) inside a profile root.
    pub cwd: PathBuf,
    /// Fixed variables and the request's allowed ones.
    pub env: BTreeMap<String, String>,
    /// Variables whose values are secrets of this host.
    pub secrets: BTreeMap<String, SecretRef>,
    /// The request's label.
    pub label: Option<String>,
    /// The sandbox it starts in (the profile's).
    pub sandbox: Sandbox,
}

impl PaneSpec {
    /// The spec as JSON for `policy explain`: environment names and secret references only.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "profile": self.profile,
            "argv": self.argv,
            "cwd": self.cwd.display().to_string(),
            "env": self.env.keys().collect::<Vec<_>>(),
            "secrets": self.secrets.iter().map(|(k, v)| (k.clone(), v.to_string())).collect::<BTreeMap<_, _>>(),
            "label": self.label,
            "sandbox": sandbox_json(&self.sandbox),
        })
    }
}

/// The sandbox as `policy explain` shows it.
fn sandbox_json(sandbox: &Sandbox) -> serde_json::Value {
    match sandbox {
        Sandbox::Off => serde_json::json!({"mode": "off"}),
        Sandbox::On(c) => serde_json::json!({
            "mode": "on",
            "network": c.network.as_str(),
            "tcp_connect": c.tcp_connect,
            "writable": c.writable.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "readable": c.readable.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "hidden": ["every home", "/run/user", "/var/tmp", "fleetd's places"],
        }),
    }
}

/// Why an allowed request cannot become a pane spec (the spawn is then refused).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// The decision was not an allow.
    #[error("the decision is not an allow")]
    NotAllowed,
    /// The profile vanished (policy reloaded between decision and spec).
    #[error("profile `{0}` is not in the policy")]
    UnknownProfile(String),
    /// The working directory does not exist or cannot be resolved on this host.
    #[error("working directory `{0}` does not exist or cannot be resolved on this host")]
    Missing(PathBuf),
    /// The working directory resolves (through a symlink) outside every root.
    #[error("working directory `{0}` resolves outside the profile's roots")]
    Escape(PathBuf),
}

/// Builds the spec for an allowed request, resolving its cwd on this host's filesystem.
pub fn pane_spec(
    policy: &PolicySet,
    request: &Request,
    decision: &Decision,
) -> Result<PaneSpec, SpecError> {
    if decision.effect != Effect::Allow {
        return Err(SpecError::NotAllowed);
    }
    let profile = policy
        .profiles
        .get(&request.profile)
        .ok_or_else(|| SpecError::UnknownProfile(request.profile.clone()))?;
    let base = profile
        .roots
        .first()
        .ok_or_else(|| SpecError::Missing(PathBuf::new()))?;
    let wanted = match &request.cwd {
        Some(relative) => base.join(relative),
        None => base.clone(),
    };
    let cwd = resolve_inside(&wanted, &profile.roots)?;
    let mut env = profile.env.clone();
    env.extend(request.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(PaneSpec {
        profile: profile.name.clone(),
        argv: profile.argv.clone(),
        cwd,
        env,
        secrets: profile.secrets.clone(),
        label: request.label.clone(),
        sandbox: profile.sandbox.clone(),
    })
}

/// `path` with symlinks resolved, if that lies inside one of `roots` (also resolved).
fn resolve_inside(path: &Path, roots: &[PathBuf]) -> Result<PathBuf, SpecError> {
    let resolved = std::fs::canonicalize(path).map_err(|_| SpecError::Missing(path.to_owned()))?;
    if !resolved.is_dir() {
        return Err(SpecError::Missing(path.to_owned()));
    }
    let inside = roots
        .iter()
        .filter_map(|root| std::fs::canonicalize(root).ok())
        .any(|root| resolved.starts_with(&root));
    if inside {
        Ok(resolved)
    } else {
        Err(SpecError::Escape(path.to_owned()))
    }
}

//! `fleetd.toml` → [`Config`]: the host's identity, broker settings, paths, multiplexer, logging.
//!
//! Search order: `--config PATH`, then `$FLEETD_CONFIG` (either must exist), then
//! `$CONFIGURATION_DIRECTORY/fleetd.toml` (systemd), `$XDG_CONFIG_HOME/fleetd/fleetd.toml` (or
//! `~/.config/fleetd/fleetd.toml`), `/etc/fleetd/fleetd.toml`; with none of them, the embedded
//! single-host defaults. Unknown keys are errors with file:line:column. A file holding a literal
//! credential is refused, naming the key, never echoing the value: secrets come from the secret
//! sources (`src/secret/`), and the config only names them.
//!
//! Imports: `secret` (its `SecretSpec`), `broker` (its queue type), `scrub` (the detector), and
//! the settings types their modules own: `api` (socket access), `roster` (timings), `state`
//! (limits), `wire` (pinned keys).

mod diag;
mod raw;

use std::path::{Path, PathBuf};

use crate::broker::topology::QueueType;
use crate::roster::RosterSettings;
use crate::secret::{BROKER_URI, SecretName, SecretSpec};
use crate::wire::PinnedKeys;

pub use diag::Diagnostic;

/// Environment variable naming the config file.
pub const ENV_CONFIG: &str = "FLEETD_CONFIG";

/// Which multiplexer owns this host's panes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Multiplexer {
    /// A dedicated tmux server (`tmux -L`).
    Tmux,
    /// herdr, over its Unix socket.
    Herdr,
}

/// How strictly fleetd confines itself with Landlock (`sandbox`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Everything the kernel supports; what was enforced is logged and shown by `fleetd status`.
    #[default]
    BestEffort,
    /// Refuse to start unless every restriction is enforced.
    Required,
    /// No self-sandbox (debugging only; logged as a warning).
    Off,
}

/// How log events are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable text (colour on a terminal).
    Text,
    /// One JSON object per line (journald, CI).
    Json,
}

/// The broker: only the name of the environment variable that holds the URI lives here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerSettings {
    /// Name of the environment variable holding the AMQP URI (`broker.uriEnv`).
    pub uri_env: Option<String>,
    /// Longest wait between reconnect attempts (`broker.backoff_cap_secs`, default 30).
    pub backoff_cap: std::time::Duration,
    /// `classic` (default; single node, LavinMQ) or `quorum` (RabbitMQ cluster).
    pub queue_type: QueueType,
    /// Origin fleets whose ingress exchange (`x.in.O`) this host's control queue is bound to.
    pub admit: Vec<String>,
    /// Allowed distance between an envelope's `created` and now (`broker.skew_secs`, default 120).
    pub skew: std::time::Duration,
    /// Most messages held for local agents (`broker.max_held`, default 10000): past it, new
    /// messages stay in the broker, handed back to it, until agents take some.
    pub max_held: u64,
    /// PEM bundle of the only CAs trusted for `amqps` (`broker.ca_file`); without it the
    /// platform's trust store is used.
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for BrokerSettings {
    fn default() -> Self {
        BrokerSettings {
            uri_env: None,
            backoff_cap: std::time::Duration::from_secs(30),
            queue_type: QueueType::Classic,
            admit: Vec::new(),
            skew: std::time::Duration::from_secs(120),
            max_held: crate::state::Limits::default().max_held,
            ca_file: None,
        }
    }
}

/// Directories fleetd reads and writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    /// The policy directory (read-only).
    pub policy: PathBuf,
    /// The state directory (read-write).
    pub state: PathBuf,
    /// The runtime directory: the local socket lives here.
    pub runtime: PathBuf,
}

/// The checked configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Where it was read from; `None` for the embedded defaults.
    pub file: Option<PathBuf>,
    /// This host's name, unique in its fleet.
    pub host: String,
    /// This host's fleet (broker vhost and user); `None`: single-host mode.
    pub fleet: Option<String>,
    /// Broker settings.
    pub broker: BrokerSettings,
    /// Paths.
    pub paths: Paths,
    /// The multiplexer backend.
    pub multiplexer: Multiplexer,
    /// The tmux server's socket: a name (`tmux -L NAME`, default `fleetd`) or an absolute path
    /// (`tmux -S PATH`, as under the systemd unit, whose private /tmp hides tmux's default
    /// directory); the server runs on its own (deploy/fleetd-tmux@.service), never started by
    /// fleetd.
    pub tmux_socket: String,
    /// The Landlock self-sandbox.
    pub sandbox: SandboxMode,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter (`info`, `fleetd=debug`, …).
    pub log_level: String,
    /// Secrets this host resolves at start, in order.
    pub secrets: Vec<SecretSpec>,
    /// Peer host keys pinned by (fleet, host): the only signatures accepted.
    pub peers: PinnedKeys,
    /// Roster timing (`[roster]`).
    pub roster: RosterSettings,
    /// Persistent agents this host keeps alive (`[[lead]]`).
    pub leads: Vec<Lead>,
    /// The group whose members get the operator's local API (`[api] operator_group`); root and
    /// fleetd's own user always do.
    pub operator_group: Option<String>,
    /// Who may reach the local API socket (`[api] socket_access`).
    pub socket_access: crate::api::SocketAccess,
}

/// A persistent agent kept alive by the lead supervisor: launched through the spawn pipeline
/// with this host as the origin (the policy must grant it), restored with backoff when it dies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lead {
    /// Its name on this host (its global id stays the same across restarts).
    pub name: String,
    /// The profile it runs.
    pub profile: String,
    /// Request variables (the grant must allow them).
    pub env: std::collections::BTreeMap<String, String>,
    /// Working directory relative to the profile's first root.
    pub cwd: Option<String>,
}

/// A file or directory that someone other than its owner (and root) may change.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{}` is {who}-writable (mode {mode:04o}): whoever can change it controls fleetd; fleetd refuses it (`chmod go-w {}`)",
    .path.display(),
    .path.display()
)]
pub struct WritableError {
    /// The file or directory.
    pub path: PathBuf,
    /// Its permission bits.
    pub mode: u32,
    /// `group` or `world`.
    pub who: &'static str,
}

/// Refuses `path` when its group or others may write it (a config file, the policy directory
/// or a policy file: each decides what other hosts may make this one run). A missing path is
/// not an error here: loading reports it.
pub fn refuse_writable(path: &Path) -> Result<(), WritableError> {
    use std::os::unix::fs::PermissionsExt;
    let Ok(metadata) = std::fs::metadata(path) else {
        return Ok(());
    };
    let mode = metadata.permissions().mode() & 0o7777;
    let who = if mode & 0o002 != 0 {
        "world"
    } else if mode & 0o020 != 0 {
        "group"
    } else {
        return Ok(());
    };
    Err(WritableError {
        path: path.to_owned(),
        mode,
        who,
    })
}

/// Errors from loading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// An explicitly named config file does not exist.
    #[error("config file `{}` does not exist", .path.display())]
    NotFound {
        /// The file.
        path: PathBuf,
    },
    /// The file could not be read.
    #[error("cannot read config file `{}`", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file has errors; each is a diagnostic with file:line:column.
    #[error("config file `{}` is invalid ({} problem(s))", .path.display(), .diagnostics.len())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every problem found.
        diagnostics: Vec<Diagnostic>,
    },
}

impl Config {
    /// Finds and loads the config: `explicit` (from `--config`), else the search order.
    pub fn load(explicit: Option<&Path>) -> Result<Config, LoadError> {
        let env = std::env::var_os(ENV_CONFIG).map(PathBuf::from);
        if let Some(path) = explicit.map(Path::to_path_buf).or(env) {
            if !path.exists() {
                return Err(LoadError::NotFound { path });
            }
            return Self::load_file(&path);
        }
        match search_path().into_iter().find(|p| p.is_file()) {
            Some(path) => Self::load_file(&path),
            None => Ok(Self::defaults()),
        }
    }

    /// Loads one file.
    pub fn load_file(path: &Path) -> Result<Config, LoadError> {
        let bytes =
            zeroize::Zeroizing::new(std::fs::read(path).map_err(|source| LoadError::Read {
                path: path.to_owned(),
                source,
            })?);
        let text = String::from_utf8_lossy(&bytes);
        raw::parse(&text, path).map_err(|diagnostics| LoadError::Invalid {
            path: path.to_owned(),
            diagnostics,
        })
    }

    /// The embedded single-host defaults: no broker, tmux, text logs, per-user paths.
    pub fn defaults() -> Config {
        Config {
            file: None,
            host: hostname(),
            fleet: None,
            broker: BrokerSettings::default(),
            paths: default_paths(),
            multiplexer: Multiplexer::Tmux,
            sandbox: SandboxMode::default(),
            tmux_socket: "fleetd".to_owned(),
            log_format: LogFormat::Text,
            log_level: "info".to_owned(),
            secrets: Vec::new(),
            peers: PinnedKeys::default(),
            roster: RosterSettings::default(),
            operator_group: None,
            socket_access: crate::api::SocketAccess::Owner,
            leads: Vec::new(),
        }
    }
}

/// The `fleetd@NAME` unit instance the command line acts for (`--instance NAME`), set once at
/// start: its paths are the unit's (`/etc/fleetd`, `/var/lib/fleetd/NAME`, `/run/fleetd/NAME`),
/// not the caller's XDG directories.
static INSTANCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Acts for unit instance `name` from now on (see [`instance`]); `Err` for a name systemd would
/// not take as an instance, or when another one was set already.
pub fn use_instance(name: &str) -> Result<(), InstanceError> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        && !name.starts_with('.');
    if !valid {
        return Err(InstanceError::Name(name.to_owned()));
    }
    INSTANCE
        .set(name.to_owned())
        .map_err(|_| InstanceError::Set)
}

/// Why `--instance` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// Not a name systemd takes as an instance.
    #[error("`{0}` is not an instance name (1-64 of A-Z a-z 0-9 _ . -, as in fleetd@NAME)")]
    Name(String),
    /// Another instance was set already.
    #[error("an instance is set already")]
    Set,
}

/// The unit instance the command line acts for, if any.
pub fn instance() -> Option<&'static str> {
    INSTANCE.get().map(String::as_str)
}

/// The files tried, in order, when neither `--config` nor `$FLEETD_CONFIG` is given (for an
/// instance, the unit's `/etc/fleetd/fleetd.toml` first).
pub fn search_path() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if instance().is_some() {
        paths.push(PathBuf::from("/etc/fleetd/fleetd.toml"));
    }
    if let Some(dir) = std::env::var_os("CONFIGURATION_DIRECTORY") {
        paths.push(PathBuf::from(dir).join("fleetd.toml"));
    }
    if let Some(dir) = config_home() {
        paths.push(dir.join("fleetd").join("fleetd.toml"));
    }
    paths.push(PathBuf::from("/etc/fleetd/fleetd.toml"));
    paths
}

fn config_home() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
}

fn default_paths() -> Paths {
    let from_env = |var: &str| std::env::var_os(var).map(PathBuf::from);
    let home = from_env("HOME").unwrap_or_else(|| PathBuf::from("/"));
    let uid = rustix::process::getuid().as_raw();
    // systemd's own variables (the unit), then the instance the command line acts for (the
    // unit's directories), then the caller's XDG directories.
    let unit = |base: &str| instance().map(|name| Path::new(base).join(name));
    Paths {
        policy: from_env("CONFIGURATION_DIRECTORY")
            .map(|d| d.join("policy"))
            .or_else(|| instance().map(|_| PathBuf::from("/etc/fleetd/policy")))
            .or_else(|| config_home().map(|d| d.join("fleetd").join("policy")))
            .unwrap_or_else(|| PathBuf::from("/etc/fleetd/policy")),
        state: from_env("STATE_DIRECTORY")
            .or_else(|| unit("/var/lib/fleetd"))
            .or_else(|| from_env("XDG_STATE_HOME").map(|d| d.join("fleetd")))
            .unwrap_or_else(|| home.join(".local/state/fleetd")),
        runtime: from_env("RUNTIME_DIRECTORY")
            .or_else(|| unit("/run/fleetd"))
            .or_else(|| from_env("XDG_RUNTIME_DIR").map(|d| d.join("fleetd")))
            .unwrap_or_else(|| std::env::temp_dir().join(format!("fleetd-{uid}"))),
    }
}

/// The machine's host name (the first label is kept whole; empty falls back to `localhost`).
pub fn hostname() -> String {
    let uname = rustix::system::uname();
    let name = uname.nodename().to_string_lossy().into_owned();
    if name.is_empty() {
        "localhost".to_owned()
    } else {
        name
    }
}

/// The secret name of this host's signing key.
pub const HOST_KEY: &str = "host-key";

/// The secrets a config asks for: with a broker, its URI (from `broker.uriEnv`) and this host's
/// signing key first.
fn secret_specs(uri_env: Option<&String>, extra: Vec<SecretSpec>) -> Vec<SecretSpec> {
    let mut specs = Vec::new();
    if let (Some(var), Ok(name)) = (uri_env, SecretName::new(BROKER_URI)) {
        specs.push(SecretSpec {
            name,
            env: Some(var.clone()),
        });
        if let Ok(name) = SecretName::new(HOST_KEY) {
            specs.push(SecretSpec { name, env: None });
        }
    }
    specs.extend(extra);
    specs
}

#[cfg(test)]
mod tests;

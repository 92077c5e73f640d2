//! The checked policy: what the daemon and `evaluate` see. Built only by the loader.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use regex::Regex;

/// A rule's id, as written in the policy (or a built-in one such as `default-deny`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct RuleId(pub(super) String);

impl RuleId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an item was defined: file and line, for reviewers and test failures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// The policy file.
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// A reference to a secret held on this host; the value is resolved at launch, never stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretRef {
    /// `credential:NAME` — `$CREDENTIALS_DIRECTORY/NAME`.
    Credential(String),
    /// `keyring:NAME` — the OS keyring entry `fleetd/NAME`.
    Keyring(String),
    /// `env:NAME` — the daemon's own environment variable NAME, read at start.
    Env(String),
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretRef::Credential(name) => write!(f, "credential:{name}"),
            SecretRef::Keyring(name) => write!(f, "keyring:{name}"),
            SecretRef::Env(name) => write!(f, "env:{name}"),
        }
    }
}

/// How a launched agent is known to be ready.
#[derive(Clone, Debug)]
pub struct Readiness {
    /// A pattern on pane output; for an agent herdr starts (unsandboxed only), herdr reports
    /// readiness itself.
    pub pattern: Option<Regex>,
    /// The agent's input line (the last line on screen matching it): a typed message counts as
    /// delivered once its text has left that line, i.e. the agent took it as its turn. Without
    /// it, a message counts as delivered once typed with its Enter.
    pub input: Option<Regex>,
    /// How long to wait.
    pub timeout: Duration,
    /// How long the ready pattern must keep matching, with no dialog, before the agent counts
    /// as ready: a TUI may draw its input line first and a dialog a moment later (Codex asks
    /// about folder trust ~2 s after its input line shows).
    pub settle: Duration,
    /// Accept startup dialogs instead of reporting them.
    pub accept_dialogs: bool,
}

/// What may be launched.
#[derive(Clone, Debug)]
pub struct Profile {
    /// The profile's name.
    pub name: String,
    /// The command, argv[0] absolute.
    pub argv: Vec<String>,
    /// Working-directory roots; the first is the base of a request's relative cwd.
    pub roots: Vec<PathBuf>,
    /// Fixed environment.
    pub env: BTreeMap<String, String>,
    /// Environment names to secret references.
    pub secrets: BTreeMap<String, SecretRef>,
    /// Most instances running at once.
    pub max_instances: u32,
    /// The readiness gate.
    pub ready: Readiness,
    /// Profiles its agents may request with their capability token (`may_spawn`; none when
    /// absent). Each such request is still decided by the policy, with this host as origin.
    pub may_spawn: Vec<String>,
    /// Whether its agents may receive text from another host at all (`remote_messages`;
    /// never for an interactive shell, which would run it).
    pub remote_messages: bool,
    /// The sandbox its agents start in (`[profile.P.sandbox]`).
    pub sandbox: Sandbox,
    /// Where it was defined.
    pub location: Location,
}

/// The sandbox a profile's agents start in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sandbox {
    /// Named off by the profile (`mode = "off"`): its agents run as their user, unconfined.
    Off,
    /// Confined (the default).
    On(Confinement),
}

impl Default for Sandbox {
    fn default() -> Sandbox {
        Sandbox::On(Confinement::default())
    }
}

/// What a sandboxed agent may reach beyond its roots (which are always writable).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Confinement {
    /// Where it may connect.
    pub network: Network,
    /// TCP ports it may connect to (`None`: any); only with [`Network::Host`].
    pub tcp_connect: Option<Vec<u16>>,
    /// Paths it may write beyond its roots.
    pub writable: Vec<PathBuf>,
    /// Paths it may read that are hidden by default (in a home, say).
    pub readable: Vec<PathBuf>,
}

/// Where a sandboxed agent may connect.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// No IPv4 or IPv6 socket at all, in a network namespace of its own (the default).
    #[default]
    None,
    /// A network namespace of its own: its own loopback only (servers it starts itself).
    Loopback,
    /// The host's network (TCP connect limited to `tcp_connect` when that is given).
    Host,
}

impl Network {
    /// The word the policy uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Loopback => "loopback",
            Network::Host => "host",
        }
    }
}

/// A variable a grant lets requests set.
#[derive(Clone, Debug)]
pub struct EnvRule {
    /// The value pattern, compiled anchored (`^(?:…)$`).
    pub pattern: Regex,
    /// The pattern as written.
    pub source: String,
    /// Longest value in bytes.
    pub max_len: usize,
    /// Where its pattern is written.
    pub location: Location,
}

/// Requests allowed per window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Requests per window.
    pub count: u32,
    /// The window.
    pub per: Duration,
}

/// Who may ask for which profiles, with which environment.
#[derive(Clone, Debug)]
pub struct Grant {
    /// Its id.
    pub id: RuleId,
    /// Origin fleets admitted.
    pub fleets: BTreeSet<String>,
    /// Origin hosts admitted (`None`: any host of those fleets).
    pub hosts: Option<BTreeSet<String>>,
    /// Profiles they may request.
    pub profiles: BTreeSet<String>,
    /// Variables they may set.
    pub env: BTreeMap<String, EnvRule>,
    /// Dangerous names deliberately allowed.
    pub allow_dangerous: BTreeSet<String>,
    /// Whether the request may choose its cwd.
    pub cwd: bool,
    /// Most instances per origin fleet through this grant.
    pub max_concurrent: Option<u32>,
    /// Request rate per origin fleet through this grant.
    pub rate: Option<Rate>,
    /// Where it was defined.
    pub location: Location,
}

/// An explicit refusal; beats any grant.
#[derive(Clone, Debug)]
pub struct Deny {
    /// Its id.
    pub id: RuleId,
    /// The refusal reason.
    pub description: Option<String>,
    /// Fleets it applies to (`None`: all).
    pub fleets: Option<BTreeSet<String>>,
    /// Hosts it applies to (`None`: all).
    pub hosts: Option<BTreeSet<String>>,
    /// Profiles it applies to (`None`: all).
    pub profiles: Option<BTreeSet<String>>,
    /// Applies when the request sets any of these (`None`: always).
    pub env: Option<BTreeSet<String>>,
    /// Where it was defined.
    pub location: Location,
}

/// Who on other hosts may message the local agents of which profiles (beyond each agent's
/// spawner and the agents it spawned, which need no rule).
#[derive(Clone, Debug)]
pub struct MessageGrant {
    /// Its id.
    pub id: RuleId,
    /// Origin fleets admitted.
    pub fleets: BTreeSet<String>,
    /// Origin hosts admitted (`None`: any host of those fleets).
    pub hosts: Option<BTreeSet<String>>,
    /// Profiles whose agents they may message ([`MAILBOX`]: the primary's mailboxes).
    pub profiles: BTreeSet<String>,
    /// Where it was defined.
    pub location: Location,
}

/// The profile name of a mailbox (the primary's inbox, opened with `agent open`): not a policy
/// profile, but a `[[message]]` rule may name it.
pub const MAILBOX: &str = "mailbox";

/// A whole checked policy directory.
#[derive(Clone, Debug, Default)]
pub struct PolicySet {
    /// Profiles by name.
    pub profiles: BTreeMap<String, Profile>,
    /// Grants in file order.
    pub grants: Vec<Grant>,
    /// Deny rules in file order.
    pub denies: Vec<Deny>,
    /// Message rules in file order.
    pub messages: Vec<MessageGrant>,
}

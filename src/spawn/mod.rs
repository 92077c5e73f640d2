//! The spawn pipeline (DESIGN.md "Spawn"), the same for local and remote requests: the
//! policy's decision (deny by default) → the pane spec from the profile → this host's secrets
//! resolved into the pane's environment only → launch through the multiplexer → the readiness
//! gate (the profile's pattern on pane output; a startup dialog is reported, not accepted,
//! unless the profile says so) → started, refused or failed, each with its reasons.
//!
//! Registering the agent, announcing it and replying are the caller's (the daemon's) steps.
//!
//! Imports: `pane` (the multiplexer), `policy` (decision, spec), `sandbox::agent` (the agent's
//! sandbox plan). Secret values arrive through a resolver the daemon passes in.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use secrecy::SecretString;

use crate::pane::process::Watched;
use crate::pane::{Launch, Multiplexer, PaneError, PaneId, PaneState};
use crate::policy::{
    Decision, Effect, PaneSpec, PolicySet, Request, RuleId, Sandbox, SecretRef, Usage, evaluate,
    pane_spec,
};

/// The longest last line of an agent that exited before it was ready, in the reason.
const LAST_LINE_CHARS: usize = 200;

/// `: its last line: "…"`, when there is one.
fn last_line(last: &Option<String>) -> String {
    last.as_ref()
        .map(|l| format!("; its last line: {l:?}"))
        .unwrap_or_default()
}

/// The longest pause between two looks of the readiness gate: an agent's `started` reaches
/// whoever asked within this and a broker round trip of its ready line (issue 37: ≤ 50 ms). A
/// look is two short tmux client calls.
const GATE_PAUSE: Duration = Duration::from_millis(25);

/// Lines of pane output the readiness gate looks at.
const GATE_LINES: usize = 50;
/// Phrases of startup dialogs that block an agent until someone answers: folder trust (Claude
/// Code, Codex), Claude Code's question about an API key in its environment, Codex's login
/// menu, and the footers of both CLIs' dialogs and pickers (Claude Code: "Enter to confirm · Esc
/// to cancel", "Enter to set as default · … · Esc to cancel"; Codex: "Press enter to continue",
/// "enter continue · esc back", "enter select · esc back").
const DIALOGS: &[&str] = &[
    "do you trust",
    "trust the files",
    "trust this folder",
    "use this api key",
    "sign in with chatgpt",
    "enter to confirm",
    "· esc to cancel",
    "enter continue",
    "· esc back",
    "[y/n]",
    "(y/n)",
    "press enter to continue",
];

/// Why a launched pane did not become ready.
#[derive(Debug, thiserror::Error)]
enum GateError {
    /// Its process ended first; the last line it showed, when the pane still shows it (a
    /// sandbox that could not be built says why there).
    #[error("exited with status {status} before it was ready{}", last_line(.last))]
    Exited {
        /// Its exit status.
        status: i32,
        /// Its last non-blank line on screen.
        last: Option<String>,
    },
    /// The multiplexer reports the agent blocked and the profile accepts no dialogs.
    #[error(
        "blocked by a startup dialog (the multiplexer reports it; not accepted by the profile)"
    )]
    Blocked,
    /// A startup dialog on screen the profile does not accept (or a fourth one).
    #[error("blocked by a startup dialog (not accepted by the profile): {0}")]
    Dialog(String),
    /// Nothing matched within the profile's timeout.
    #[error("not ready within {0:?} (no line matched the ready pattern)")]
    NotReady(Duration),
    /// The multiplexer failed while the pane was still running.
    #[error("readiness: {0}")]
    Pane(#[from] PaneError),
}

/// How a spawn ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Launched and ready.
    Started {
        /// Its pane (host-local).
        pane: PaneId,
        /// Its process, watched by the kernel from launch, when the multiplexer named it.
        process: Option<Watched>,
        /// The profile.
        profile: String,
        /// The deciding grant(s).
        rules: Vec<RuleId>,
    },
    /// The policy said no; nothing was launched.
    Refused {
        /// The deciding rule(s).
        rules: Vec<RuleId>,
        /// Why, one line each.
        reasons: Vec<String>,
    },
    /// Allowed, but it could not be launched or did not become ready (its pane is closed).
    Failed {
        /// Why.
        reason: String,
    },
}

/// Where bubblewrap is looked for (the distribution's; never a PATH lookup).
pub const BWRAP: &[&str] = &["/usr/bin/bwrap", "/usr/local/bin/bwrap"];

/// The first of [`BWRAP`] that is installed.
pub fn find_bwrap() -> Option<std::path::PathBuf> {
    BWRAP
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.is_file())
}

/// What every agent's sandbox on this host hides and lets through (the daemon's config).
#[derive(Clone, Debug)]
pub struct HostPlaces {
    /// fleetd's own places (config, credentials, state, runtime, policy, the multiplexer's
    /// socket directory), on top of [`crate::policy::FLEETD_PLACES`].
    pub hidden: Vec<std::path::PathBuf>,
    /// fleetd's API socket, bound into every sandbox (the one way out).
    pub socket: Option<std::path::PathBuf>,
}

impl HostPlaces {
    /// `hidden` with fleetd's well-known places added.
    pub fn new(hidden: Vec<std::path::PathBuf>, socket: Option<std::path::PathBuf>) -> HostPlaces {
        let mut all: Vec<std::path::PathBuf> = crate::policy::FLEETD_PLACES
            .iter()
            .map(std::path::PathBuf::from)
            .collect();
        for path in hidden {
            if !all.contains(&path) {
                all.push(path);
            }
        }
        HostPlaces {
            hidden: all,
            socket,
        }
    }
}

/// Why an agent's sandbox cannot be built (the spawn is refused, nothing launched).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// No pane init to enter it.
    #[error("the agent's sandbox needs fleetd's pane init, which this spawner does not run")]
    NoInit,
    /// bubblewrap is not installed.
    #[error(
        "the agent's sandbox needs bubblewrap, which is not at {}: install it (Debian's \
         package `bubblewrap`), or set `mode = \"off\"` in the profile's \
         `[profile.P.sandbox]` by name",
        BWRAP.join(" or ")
    )]
    NoBwrap,
    /// The kernel allows bubblewrap no user namespace.
    #[cfg(target_os = "linux")]
    #[error(
        "the agent's sandbox cannot be built: {0}; or set `mode = \"off\"` in the profile's \
         `[profile.P.sandbox]` by name"
    )]
    NoUserNamespaces(#[source] crate::sandbox::agent::UsernsOff),
    /// The plan would show one of fleetd's places.
    #[cfg(target_os = "linux")]
    #[error("the agent's sandbox cannot be built: {0}")]
    Plan(#[source] crate::sandbox::agent::EnterError),
    /// Not on Linux.
    #[cfg(not(target_os = "linux"))]
    #[error(
        "not yet supported: the agent sandbox exists only on Linux; set `mode = \"off\"` by name"
    )]
    NotLinux,
}

/// Resolves a profile's secret reference to its value on this host, or says why it cannot
/// (the resolver's own error: the daemon's, which knows where secrets come from).
pub type Secrets<'a> =
    &'a dyn Fn(&SecretRef) -> Result<SecretString, Box<dyn std::error::Error + Send + Sync>>;

/// A profile's secret has no value on this host: the launch fails before anything runs.
#[derive(Debug, thiserror::Error)]
#[error("secret for `{name}`: {source}")]
pub struct SecretUnavailable {
    /// The variable the secret was for.
    pub name: String,
    /// Why the resolver could not give it (never carries a value).
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// One host's spawner: its multiplexer and what it launched (for the policy's limits).
pub struct Spawner {
    mux: Arc<dyn Multiplexer>,
    /// fleetd's own executable, each pane's init ([`crate::pane::init`]).
    init: Option<std::path::PathBuf>,
    /// What every agent's sandbox hides and lets through on this host.
    places: HostPlaces,
    /// The limits' one book: a spawn is decided and its slot taken under this lock.
    book: Mutex<Book>,
}

/// What the limits are counted from: the instances running or being started, and the spawns
/// allowed lately.
#[derive(Debug, Default)]
struct Book {
    instances: Vec<Instance>,
    recent: VecDeque<(Instant, RuleId, String)>,
    /// The last slot number handed out.
    slots: u64,
}

/// An instance counted against the limits: from the moment its spawn is allowed (a slot, with
/// no pane yet) until its pane is gone or its process exited.
#[derive(Clone, Debug)]
struct Instance {
    slot: u64,
    /// `None` while it is being launched and waits for its readiness gate.
    pane: Option<PaneId>,
    profile: String,
    grant: Option<RuleId>,
    fleet: String,
}

/// A running agent fleetd started before it restarted, counted again (see [`Spawner::adopt`]).
#[derive(Clone, Debug)]
pub struct Adopted {
    /// Its pane.
    pub pane: PaneId,
    /// Its profile.
    pub profile: String,
    /// The grant that admitted it, when known.
    pub grant: Option<RuleId>,
    /// The fleet it was spawned for.
    pub fleet: String,
}

/// The policy's decision on a spawn, with the slot it took when allowed.
enum Decided<'a> {
    /// Allowed: the slot is taken.
    Allowed(Decision, Slot<'a>),
    /// Refused (a rule, the default deny, or a limit).
    Refused(Decision),
    /// The book is unusable (poisoned): nothing is decided, nothing launched.
    Unusable,
}

/// A slot taken for an allowed spawn: given back when dropped unless its pane is kept
/// ([`Slot::keep`]).
struct Slot<'a> {
    book: &'a Mutex<Book>,
    slot: u64,
}

impl Slot<'_> {
    /// The spawn started: the slot is its pane's from now on (counted until it exits).
    fn keep(self, pane: &PaneId) {
        if let Ok(mut book) = self.book.lock()
            && let Some(instance) = book.instances.iter_mut().find(|i| i.slot == self.slot)
        {
            instance.pane = Some(pane.clone());
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Ok(mut book) = self.book.lock() {
            book.instances
                .retain(|i| i.slot != self.slot || i.pane.is_some());
        }
    }
}

impl Spawner {
    /// A spawner launching through `mux`.
    pub fn new(mux: Arc<dyn Multiplexer>) -> Spawner {
        Spawner {
            mux,
            init: None,
            places: HostPlaces::new(Vec::new(), None),
            book: Mutex::new(Book::default()),
        }
    }

    /// Runs `init` (fleetd's own executable) first in every pane, as its init: whatever the
    /// agent starts ends with it ([`crate::pane::init`]). Without it, the argv runs directly.
    #[must_use]
    pub fn with_init(mut self, init: std::path::PathBuf) -> Spawner {
        self.init = Some(init);
        self
    }

    /// Hides `places` from every sandboxed agent and binds its socket in.
    #[must_use]
    pub fn with_places(mut self, places: HostPlaces) -> Spawner {
        self.places = places;
        self
    }

    /// The multiplexer.
    pub fn mux(&self) -> &Arc<dyn Multiplexer> {
        &self.mux
    }

    /// Runs the pipeline for `request` under `policy` (blocking: the readiness gate waits).
    /// `identity` is what fleetd itself gives the agent (its id, socket, token): set last, so
    /// neither the profile nor the request can replace it.
    pub fn spawn(
        &self,
        policy: &PolicySet,
        request: &Request,
        secrets: Secrets<'_>,
        identity: &[(&str, &SecretString)],
    ) -> Outcome {
        let (decision, slot) = match self.decide(policy, request) {
            Decided::Allowed(decision, slot) => (decision, slot),
            Decided::Refused(decision) => {
                return Outcome::Refused {
                    rules: decision.rules,
                    reasons: decision.reasons,
                };
            }
            Decided::Unusable => {
                return Outcome::Failed {
                    reason: "the spawn limits' book is unusable (a spawn panicked holding it); \
                             restart fleetd"
                        .to_owned(),
                };
            }
        };
        let spec = match pane_spec(policy, request, &decision) {
            Ok(spec) => spec,
            Err(error) => {
                return Outcome::Refused {
                    rules: decision.rules,
                    reasons: vec![error.to_string()],
                };
            }
        };
        let mut launch = match launch_of(&spec, secrets, identity, self.init.clone()) {
            Ok(launch) => launch,
            Err(error) => {
                return Outcome::Failed {
                    reason: error.to_string(),
                };
            }
        };
        match self.sandbox_of(policy, &spec, &launch) {
            Ok(plan) => launch.sandbox = plan,
            Err(reason) => {
                return Outcome::Refused {
                    rules: decision.rules,
                    reasons: vec![reason.to_string()],
                };
            }
        }
        let asked = crate::pane::process::ticks_now();
        let pane = match self.mux.launch(&launch) {
            Ok(pane) => pane,
            Err(error) => {
                return Outcome::Failed {
                    reason: format!("launch: {error}"),
                };
            }
        };
        // The process is watched from now on, through the kernel: a pid descriptor names it
        // and no later process that reuses its pid.
        let watched = match self.mux.pid(&pane).map(|pid| pid.map(Watched::launched)) {
            Ok(None) => None,
            // The multiplexer named a pane whose process is older than the request: not the
            // pane fleetd asked for (a hook or a fake server pointing at another agent's or
            // the user's pane). Refused, and left alone: it is not fleetd's to close.
            Ok(Some(Ok(Some(watched)))) if asked.is_some_and(|t| watched.started_before(t)) => {
                return Outcome::Failed {
                    reason: format!(
                        "the multiplexer named pane {pane}, whose process (pid {}) started \
                         before fleetd asked for it: not the pane fleetd launched",
                        watched.pid()
                    ),
                };
            }
            Ok(Some(Ok(Some(watched)))) => Some(watched),
            Ok(Some(Ok(None))) => None, // already ended: the gate reports its exit
            // Gone before its process could be asked for (a command that exits at once; herdr
            // drops such a pane): it ended, and the gate reports how (its exit status).
            Err(PaneError::NoPane(_)) => None,
            Ok(Some(Err(error))) => {
                let _ = self.mux.close(&pane);
                return Outcome::Failed {
                    reason: format!("cannot watch the pane's process: {error}"),
                };
            }
            Err(error) => {
                let _ = self.mux.close(&pane);
                return Outcome::Failed {
                    reason: format!("cannot learn the pane's process: {error}"),
                };
            }
        };
        let Some(profile) = policy.profiles.get(&spec.profile) else {
            let _ = self.mux.close(&pane);
            return Outcome::Failed {
                reason: format!("profile `{}` vanished", spec.profile),
            };
        };
        if let Err(error) = self.gate(&pane, profile) {
            let _ = self.mux.close(&pane);
            // The sandbox could not be built (bwrap or the pane's init said why on screen):
            // that, and the fix, rather than an agent that merely exited.
            let reason = match (&error, launch.sandbox.is_some()) {
                (
                    GateError::Exited {
                        last: Some(line), ..
                    },
                    true,
                ) if line.starts_with("bwrap:") || crate::pane::init::is_failure(line) => {
                    format!(
                        "the agent's sandbox could not be built: {line} — bubblewrap needs \
                         unprivileged user namespaces (on Ubuntu, an AppArmor profile for bwrap); \
                         `fleetd sandbox probe` says what agents get on this host; or set \
                         `mode = \"off\"` in the profile's [profile.P.sandbox] by name"
                    )
                }
                _ => error.to_string(),
            };
            return Outcome::Failed { reason };
        }
        // What it runs once ready is what it must keep running (a wrapper may have executed
        // the agent before).
        let watched = watched.map(|mut watched| {
            watched.settle();
            watched
        });
        slot.keep(&pane);
        Outcome::Started {
            pane,
            process: watched,
            profile: spec.profile,
            rules: decision.rules,
        }
    }

    /// The sandbox plan of `spec`'s agent (`None`: its profile says `mode = "off"`).
    #[cfg(target_os = "linux")]
    fn sandbox_of(
        &self,
        policy: &PolicySet,
        spec: &PaneSpec,
        launch: &Launch,
    ) -> Result<Option<String>, SandboxError> {
        use crate::sandbox::agent::Plan;
        let Sandbox::On(confinement) = &spec.sandbox else {
            return Ok(None);
        };
        let init = self.init.clone().ok_or(SandboxError::NoInit)?;
        let bwrap = find_bwrap().ok_or(SandboxError::NoBwrap)?;
        if let Some(off) = crate::sandbox::agent::userns_off(
            std::path::Path::new(crate::sandbox::agent::PROC_SYS),
            &bwrap,
        ) {
            return Err(SandboxError::NoUserNamespaces(off));
        }
        let roots = policy
            .profiles
            .get(&spec.profile)
            .map(|p| p.roots.clone())
            .unwrap_or_default();
        let mut readable = confinement.readable.clone();
        // The agent's program and fleetd's (its `fleetd send`), where the sandbox would hide
        // them (a home, /tmp), are shown read-only.
        readable.extend(
            spec.argv
                .first()
                .map(std::path::PathBuf::from)
                .into_iter()
                .chain([init.clone()])
                .filter(|p| crate::sandbox::agent::hidden_by_default(p)),
        );
        let plan = Plan {
            bwrap,
            network: confinement.network,
            tcp_connect: confinement.tcp_connect.clone(),
            cwd: spec.cwd.clone(),
            writable: roots
                .into_iter()
                .chain(confinement.writable.iter().cloned())
                .collect(),
            readable,
            hidden: self.places.hidden.clone(),
            socket: self.places.socket.clone(),
            env: launch.env.keys().cloned().collect(),
        };
        plan.check().map_err(SandboxError::Plan)?;
        Ok(Some(plan.to_arg()))
    }

    #[cfg(not(target_os = "linux"))]
    fn sandbox_of(
        &self,
        _policy: &PolicySet,
        spec: &PaneSpec,
        _launch: &Launch,
    ) -> Result<Option<String>, SandboxError> {
        match spec.sandbox {
            Sandbox::Off => Ok(None),
            Sandbox::On(_) => Err(SandboxError::NotLinux),
        }
    }

    /// Waits until the pane shows the profile's ready pattern (for its settle time); fails on
    /// exit, on a startup dialog (unless the profile accepts them: Enter, once each) or at the
    /// timeout.
    ///
    /// Dialogs are looked for first: a menu line of a dialog (Codex's `> 1. Sign in with
    /// ChatGPT`, Claude Code's `❯ 1. Yes`) can match a ready pattern, so a line matching the
    /// pattern counts only below the last dialog line on screen.
    fn gate(&self, pane: &PaneId, profile: &crate::policy::Profile) -> Result<(), GateError> {
        let deadline = Instant::now() + profile.ready.timeout;
        let mut accepted = 0;
        // Looks again soon at first (an agent that is ready in milliseconds is seen then), less
        // often as it takes longer: an eighth of the time so far (at least 2 ms, at most
        // GATE_PAUSE), so readiness is seen at most ~12 % and GATE_PAUSE late.
        let asked = Instant::now();
        // Since when every look found it ready (see `Readiness::settle`).
        let mut ready_since: Option<Instant> = None;
        loop {
            if let PaneState::Exited(status) = self.mux.state(pane)? {
                return Err(self.exited(pane, status));
            }
            let shown = self
                .mux
                .read(pane, GATE_LINES)
                .map_err(|e| self.exited_or(pane, e))?;
            // herdr knows when its agent is interactive-ready; tmux needs the profile's pattern.
            let known = match self.mux.ready(pane) {
                Some(known) => Some(known.map_err(|e| self.exited_or(pane, e))?),
                None => None,
            };
            let screen = judge(&shown, profile.ready.pattern.as_ref(), known);
            if screen == Screen::Ready {
                let since = *ready_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= profile.ready.settle {
                    return Ok(());
                }
            } else {
                ready_since = None;
            }
            if self.mux.blocked(pane) == Some(true) && !profile.ready.accept_dialogs {
                return Err(GateError::Blocked);
            }
            if let Screen::Dialog(line) = screen {
                if !profile.ready.accept_dialogs || accepted >= 3 {
                    return Err(GateError::Dialog(line));
                }
                accepted += 1;
                self.mux
                    .send_text(pane, "")
                    .map_err(|e| self.exited_or(pane, e))?;
            }
            if Instant::now() >= deadline {
                return Err(GateError::NotReady(profile.ready.timeout));
            }
            std::thread::sleep((asked.elapsed() / 8).clamp(Duration::from_millis(2), GATE_PAUSE));
        }
    }

    /// A pane call failed mid-gate. The pane may have exited since the last look (herdr drops
    /// an exited pane within moments): then its exit is the reason, not the failed call.
    fn exited_or(&self, pane: &PaneId, error: PaneError) -> GateError {
        match self.mux.state(pane) {
            Ok(PaneState::Exited(status)) => self.exited(pane, status),
            _ => GateError::Pane(error),
        }
    }

    /// The pane's process ended with `status`: that, and its last line if the pane shows it.
    fn exited(&self, pane: &PaneId, status: i32) -> GateError {
        let last = self.mux.read(pane, 5).ok().and_then(|shown| {
            // tmux's own "Pane is dead (status …)" line (remain-on-exit) is not the agent's.
            let line = shown
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty() && !l.starts_with("Pane is dead"))?
                .trim();
            Some(line.chars().take(LAST_LINE_CHARS).collect())
        });
        GateError::Exited { status, last }
    }

    /// The policy's decision on `request`, and when it allows, the slot the spawn takes: both
    /// under the book's lock, so that concurrent spawns each see the others' slots (the limits
    /// count an instance from its decision, not from its readiness).
    fn decide(&self, policy: &PolicySet, request: &Request) -> Decided<'_> {
        let Ok(mut book) = self.book.lock() else {
            return Decided::Unusable;
        };
        // Instances whose pane is gone or exited no longer count; those being started do.
        book.instances
            .retain(|i| i.pane.as_ref().is_none_or(|pane| self.runs(pane)));
        let decision = evaluate(policy, request, &*book);
        if decision.effect != Effect::Allow {
            return Decided::Refused(decision);
        }
        let grant = decision.rules.first().cloned();
        if let Some(grant) = &grant {
            book.recent
                .push_back((Instant::now(), grant.clone(), request.origin.fleet.clone()));
            while book.recent.len() > 10_000 {
                book.recent.pop_front();
            }
        }
        let slot = book.count(
            None,
            request.profile.clone(),
            grant,
            request.origin.fleet.clone(),
        );
        Decided::Allowed(
            decision,
            Slot {
                book: &self.book,
                slot,
            },
        )
    }

    /// Counts `agents` — started by a fleetd before this one and still running in their panes
    /// — against the limits, as if this spawner had started them. The daemon calls it at start,
    /// before any spawn is decided: a restart does not reset `max_instances`.
    pub fn adopt(&self, agents: Vec<Adopted>) {
        let Ok(mut book) = self.book.lock() else {
            return;
        };
        for agent in agents {
            if !self.runs(&agent.pane)
                || book
                    .instances
                    .iter()
                    .any(|i| i.pane.as_ref() == Some(&agent.pane))
            {
                continue;
            }
            book.count(Some(agent.pane), agent.profile, agent.grant, agent.fleet);
        }
    }

    /// Whether `pane` still runs its process (a pane gone, exited or unreadable does not).
    fn runs(&self, pane: &PaneId) -> bool {
        matches!(self.mux.state(pane), Ok(PaneState::Running))
    }
}

impl Book {
    /// Counts one more instance from now on; its slot's number.
    fn count(
        &mut self,
        pane: Option<PaneId>,
        profile: String,
        grant: Option<RuleId>,
        fleet: String,
    ) -> u64 {
        self.slots += 1;
        self.instances.push(Instance {
            slot: self.slots,
            pane,
            profile,
            grant,
            fleet,
        });
        self.slots
    }
}

impl Usage for Book {
    fn running(&self, profile: &str) -> u32 {
        count(self.instances.iter().filter(|i| i.profile == profile))
    }

    fn running_through(&self, grant: &RuleId, fleet: &str) -> u32 {
        count(
            self.instances
                .iter()
                .filter(|i| i.grant.as_ref() == Some(grant) && i.fleet == fleet),
        )
    }

    fn recent_through(&self, grant: &RuleId, fleet: &str, window: Duration) -> u32 {
        let since = Instant::now().checked_sub(window);
        count(self.recent.iter().filter(|(at, g, f)| {
            g == grant && f == fleet && since.is_none_or(|since| *at >= since)
        }))
    }
}

/// How many `items` there are, as the policy counts.
fn count<T>(items: impl Iterator<Item = T>) -> u32 {
    u32::try_from(items.count()).unwrap_or(u32::MAX)
}

/// The launch for `spec`: its fixed and allowed environment plus this host's secrets.
fn launch_of(
    spec: &PaneSpec,
    secrets: Secrets<'_>,
    identity: &[(&str, &SecretString)],
    init: Option<std::path::PathBuf>,
) -> Result<Launch, SecretUnavailable> {
    let mut env = spec.env.clone();
    for (name, reference) in &spec.secrets {
        let value = secrets(reference).map_err(|source| SecretUnavailable {
            name: name.clone(),
            source,
        })?;
        #[expect(
            clippy::disallowed_methods,
            reason = "the value goes only into the pane's environment"
        )]
        let plain = secrecy::ExposeSecret::expose_secret(&value).to_owned();
        env.insert(name.clone(), plain);
    }
    for (name, value) in identity {
        #[expect(
            clippy::disallowed_methods,
            reason = "the agent's own token goes only into its pane's environment"
        )]
        let plain = secrecy::ExposeSecret::expose_secret(*value).to_owned();
        env.insert((*name).to_owned(), plain);
    }
    Ok(Launch {
        argv: spec.argv.clone(),
        cwd: spec.cwd.clone(),
        env,
        init,
        sandbox: None,
    })
}

/// What a pane's screen says during the readiness gate.
#[derive(Debug, PartialEq, Eq)]
enum Screen {
    /// The agent is ready.
    Ready,
    /// A dialog waits for an answer; its first line (the question, not its footer).
    Dialog(String),
    /// Neither yet.
    Starting,
}

/// Judges `shown` for the gate. Dialogs are looked for first: a menu line of a dialog (Codex's
/// `> 1. Sign in with ChatGPT`, `› 1. Trust and continue`, Claude Code's `❯ 1. Yes`) can match
/// a ready pattern, so a matching line counts only below the last dialog line on screen.
/// `known`: the multiplexer's own word on readiness (herdr), which a dialog still overrules.
fn judge(shown: &str, pattern: Option<&regex::Regex>, known: Option<bool>) -> Screen {
    let lines: Vec<&str> = shown.lines().collect();
    let dialog = lines.iter().rposition(|line| is_dialog(line));
    let ready = match (known, pattern) {
        (Some(known), _) => known && dialog.is_none(),
        (None, Some(pattern)) => lines
            .iter()
            .rposition(|line| pattern.is_match(line))
            .is_some_and(|at| dialog.is_none_or(|d| at > d)),
        (None, None) => dialog.is_none(),
    };
    match (ready, dialog) {
        (true, _) => Screen::Ready,
        (false, Some(_)) => Screen::Dialog(dialog_line(shown).unwrap_or_default()),
        (false, None) => Screen::Starting,
    }
}

/// The first line that looks like a startup dialog.
pub fn dialog_line(shown: &str) -> Option<String> {
    shown
        .lines()
        .find(|line| is_dialog(line))
        .map(reported_line)
}

/// Whether screen line `line` is part of a startup dialog.
fn is_dialog(line: &str) -> bool {
    let lower = line.to_lowercase();
    DIALOGS.iter().any(|d| lower.contains(d))
}

/// A screen line as a dialog or prompt is reported: trimmed, its first 120 characters.
pub fn reported_line(line: &str) -> String {
    line.trim().chars().take(120).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Screens of the real CLIs (`@anthropic-ai/claude-code` 2.1.197, `@openai/codex` 0.171.0)
    /// in a 100×40 tmux pane, captured as `capture-pane -p` prints them.
    fn screen(name: &str) -> &'static str {
        match name {
            "claude-trust" => include_str!("../../tests/fixtures/screens/claude-trust.txt"),
            "claude-api-key" => include_str!("../../tests/fixtures/screens/claude-api-key.txt"),
            "claude-ready" => include_str!("../../tests/fixtures/screens/claude-ready.txt"),
            "codex-login" => include_str!("../../tests/fixtures/screens/codex-login.txt"),
            "codex-trust" => include_str!("../../tests/fixtures/screens/codex-trust.txt"),
            "codex-ready" => include_str!("../../tests/fixtures/screens/codex-ready.txt"),
            other => panic!("no screen {other}"),
        }
    }

    fn pattern(source: &str) -> regex::Regex {
        regex::Regex::new(source).unwrap()
    }

    #[test]
    fn the_shipped_patterns_see_the_real_clis_ready() {
        assert_eq!(
            judge(screen("claude-ready"), Some(&pattern("^❯")), None),
            Screen::Ready
        );
        assert_eq!(
            judge(screen("codex-ready"), Some(&pattern("^›")), None),
            Screen::Ready
        );
        // The pattern shipped before issue 34 never matched Claude Code's input line.
        assert_eq!(
            judge(screen("claude-ready"), Some(&pattern("^> ")), None),
            Screen::Starting
        );
    }

    #[test]
    fn a_dialog_menu_line_is_never_ready_whatever_the_pattern() {
        let cases = [
            ("claude-trust", "Quick safety check"),
            ("claude-api-key", "Do you want to use this API key?"),
            ("codex-login", "Choose how you want to use Codex."),
            ("codex-trust", "Trust this folder?"),
        ];
        for (name, line) in cases {
            // Patterns that match the dialogs' own menu lines, as a loose profile would write.
            for source in ["^> ", "^›", "❯", "^\\s*[>›❯]", "."] {
                match judge(screen(name), Some(&pattern(source)), None) {
                    Screen::Dialog(shown) => assert!(
                        shown.contains(line) || screen(name).contains(&shown),
                        "{name}: reported {shown:?}"
                    ),
                    other => panic!("{name} with {source:?}: {other:?}"),
                }
            }
            // herdr calling it ready does not overrule the dialog on screen.
            assert!(matches!(
                judge(screen(name), None, Some(true)),
                Screen::Dialog(_)
            ));
        }
    }

    #[test]
    fn dialogs_are_reported_by_their_question() {
        let reported = |name| match judge(screen(name), Some(&pattern("^❯")), None) {
            Screen::Dialog(line) => line,
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(
            reported("claude-api-key"),
            "Do you want to use this API key?"
        );
        assert!(
            reported("claude-trust").contains("trust"),
            "{}",
            reported("claude-trust")
        );
        assert_eq!(reported("codex-login"), "> 1. Sign in with ChatGPT");
        assert!(reported("codex-trust").starts_with("Trust this folder?"));
    }

    #[test]
    fn an_old_dialog_above_a_later_ready_line_does_not_hold_the_gate() {
        let shown = "Do you trust the files in this folder? (y/n)\ny\nagent> ready\n";
        assert_eq!(
            judge(shown, Some(&pattern("^agent> ready")), None),
            Screen::Ready
        );
        assert_eq!(judge("agent> ready\n", None, None), Screen::Ready);
        assert_eq!(
            judge("starting…\n", Some(&pattern("^agent> ")), None),
            Screen::Starting
        );
    }
}

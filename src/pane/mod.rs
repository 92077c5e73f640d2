//! Terminal panes: the `Multiplexer` trait fleetd drives panes through, its tmux and herdr
//! backends, and the pane-safe text sanitiser that everything typed passes through.
//!
//! The multiplexer server is never fleetd's child: fleetd connects to one that runs on its own
//! (a dedicated tmux socket started by the operator's unit, or the user's herdr), so fleetd's
//! own sandbox and unit restrictions are not inherited by agents.
//!
//! Imports: nothing from the crate (a leaf).

pub mod herdr;
pub mod init;
pub mod process;
pub mod sanitize;
pub mod tmux;

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The subcommand the multiplexer runs as the pane's init: `FLEETD pane-init -- ARGV` (the init
/// is `init.rs`; `process.rs` knows an init's process by it).
pub const INIT_SUBCOMMAND: &str = "pane-init";

/// A pane's id on its multiplexer (tmux `%N`, herdr `wN:pM`). Host-local: never leaves this host.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PaneId(pub String);

impl std::fmt::Display for PaneId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What to launch in a new pane.
#[derive(Clone, PartialEq, Eq)]
pub struct Launch {
    /// The program and its arguments (no shell in between).
    pub argv: Vec<String>,
    /// The working directory.
    pub cwd: PathBuf,
    /// Environment for the pane's process (secrets included: never logged, never on an argv).
    pub env: BTreeMap<String, String>,
    /// fleetd's own executable, run first in the pane as its init (`INIT pane-init -- ARGV`,
    /// [`init`]): what the agent starts ends with it. `None`: the argv runs directly.
    pub init: Option<PathBuf>,
    /// The agent's sandbox plan, which the init enters first (`INIT pane-init --sandbox PLAN
    /// -- ARGV`; fleetd's `sandbox::agent`). Needs `init`.
    pub sandbox: Option<String>,
}

/// The init's option that carries a sandbox plan.
pub const SANDBOX_OPTION: &str = "--sandbox";

impl Launch {
    /// The command the pane runs: the argv behind the init (and in its sandbox), when there is
    /// one.
    pub fn command(&self) -> Result<Vec<String>, PaneError> {
        let Some(init) = &self.init else {
            if self.sandbox.is_some() {
                return Err(PaneError::Refused(
                    "a sandboxed agent needs fleetd's pane init".to_owned(),
                ));
            }
            return Ok(self.argv.clone());
        };
        let init = init.to_str().ok_or_else(|| {
            PaneError::Refused(format!(
                "fleetd's own path `{}` is not UTF-8",
                init.display()
            ))
        })?;
        let mut command = vec![init.to_owned(), init::SUBCOMMAND.to_owned()];
        if let Some(plan) = &self.sandbox {
            command.extend([SANDBOX_OPTION.to_owned(), plan.clone()]);
        }
        command.push("--".to_owned());
        command.extend(self.argv.iter().cloned());
        Ok(command)
    }
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("argv", &self.argv)
            .field("cwd", &self.cwd)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("init", &self.init)
            .field("sandbox", &self.sandbox.is_some())
            .finish()
    }
}

/// Where a pane's process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaneState {
    /// Its process runs.
    Running,
    /// Its process ended with this status (the pane stays until closed).
    Exited(i32),
}

/// Why a multiplexer call failed. Names the operation; never the text typed or the environment.
#[derive(Debug, thiserror::Error)]
pub enum PaneError {
    /// The multiplexer cannot be reached (its server is not running, or the call timed out).
    #[error("{backend}: {op}: {detail}")]
    Unavailable {
        /// Which backend.
        backend: &'static str,
        /// Which operation.
        op: &'static str,
        /// What happened.
        detail: String,
    },
    /// The pane does not exist.
    #[error("no pane {0}")]
    NoPane(PaneId),
    /// The request cannot be carried out safely.
    #[error("refused: {0}")]
    Refused(String),
}

/// A terminal multiplexer fleetd launches agents in and types into.
pub trait Multiplexer: Send + Sync {
    /// Launches `launch` in a new pane; returns its id.
    fn launch(&self, launch: &Launch) -> Result<PaneId, PaneError>;
    /// Types `text` into the pane (sanitised here first), then presses Enter.
    fn send_text(&self, pane: &PaneId, text: &str) -> Result<(), PaneError>;
    /// Types `text` into the pane only while its process is `pid` — the process fleetd
    /// launched there, not one a respawn put in its place. tmux decides in the same command
    /// queue as the paste; the default asks first.
    fn send_text_to(&self, pane: &PaneId, pid: u32, text: &str) -> Result<(), PaneError> {
        same_process(pane, self.pid(pane)?, pid)?;
        self.send_text(pane, text)
    }
    /// Types `text` into the pane (sanitised here first) without pressing Enter — with `pid`,
    /// only while that is the pane's process (as [`Multiplexer::send_text_to`] decides it).
    fn type_text(&self, pane: &PaneId, pid: Option<u32>, text: &str) -> Result<(), PaneError>;
    /// Presses Enter in the pane — with `pid`, only while that is the pane's process.
    fn press_enter(&self, pane: &PaneId, pid: Option<u32>) -> Result<(), PaneError>;
    /// The process id of the pane's process, when the backend knows it.
    fn pid(&self, _pane: &PaneId) -> Result<Option<u32>, PaneError> {
        Ok(None)
    }
    /// The last `lines` lines the pane shows.
    fn read(&self, pane: &PaneId, lines: usize) -> Result<String, PaneError>;
    /// Whether the pane's process runs or exited (and how).
    fn state(&self, pane: &PaneId) -> Result<PaneState, PaneError>;
    /// Closes the pane (its process gets SIGHUP).
    fn close(&self, pane: &PaneId) -> Result<(), PaneError>;
    /// Every pane on this multiplexer.
    fn list(&self) -> Result<Vec<PaneId>, PaneError>;
    /// Whether the pane's agent waits for an answer, when the backend knows (herdr reports
    /// `blocked`); `None`: look at the screen instead.
    fn blocked(&self, _pane: &PaneId) -> Option<bool> {
        None
    }
    /// Whether the pane's agent is interactive-ready, when the backend knows (herdr's
    /// `agent.get` `interactive_ready`); `None`: use the profile's ready pattern.
    fn ready(&self, _pane: &PaneId) -> Option<Result<bool, PaneError>> {
        None
    }
    /// What the multiplexer's server asked of fleetd and was refused since the last call
    /// (opening a path, running a command): each a sign that the server is hostile or fake,
    /// for the daemon to log and audit. Taken once.
    fn alarms(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Refuses typing into `pane` when its process is `now`, not the agent's `pid`.
fn same_process(pane: &PaneId, now: Option<u32>, pid: u32) -> Result<(), PaneError> {
    match now {
        Some(now) if now != pid => Err(PaneError::Refused(format!(
            "pane {pane} now runs pid {now}, not the agent's {pid}: nothing typed"
        ))),
        _ => Ok(()),
    }
}

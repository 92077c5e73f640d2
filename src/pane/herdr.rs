//! The herdr backend, over herdr's socket API: newline-delimited JSON, one request per
//! connection (`{"id","method","params"}` → `{"id","result"}` or `{"id","error":{code,message}}`),
//! driven against a real herdr 0.8.2 (protocol 20) in the tests.
//!
//! - **The socket** is found as herdr finds it: `HERDR_SOCKET_PATH`; else the config directory
//!   (`$XDG_CONFIG_HOME/herdr`, `~/.config/herdr`) and, for a named session (`HERDR_SESSION`),
//!   its `sessions/NAME/herdr.sock`, else `herdr.sock`. `ping`'s protocol is checked on open.
//! - **A place of its own:** every pane is the root pane of a new tab (`tab.create`, never
//!   focused) in the workspace labelled `fleetd`, created (unfocused) when missing. fleetd never
//!   splits, resizes or focuses a pane it did not create.
//! - **Commands run as the pane's process:** herdr 0.8.2 cannot give a pane a command, so the
//!   command goes into the pane's environment (`FLEETD_RUN`, a POSIX `sh` script with the argv
//!   single-quoted) and the one constant line ` exec /bin/sh -c "$FLEETD_RUN"` is typed: the
//!   shell is replaced, nothing from the request is ever parsed by the user's shell, and when
//!   the command ends the pane ends. Before it exits, the script records the command's status on
//!   its pane as the token `fleetd_exit` (`herdr pane report-metadata`, herdr's own binary).
//! - **Agents herdr knows** (argv[0]'s file name is one of herdr's agent binaries) are started
//!   with `agent.start` under a name `fleetd-XXXXXXXX`, recorded on the pane as the token
//!   `fleetd_agent` so that a restarted fleetd finds it again. herdr runs the agent by its PATH
//!   name; an absolute argv[0] puts its directory first on the pane's PATH, so that name resolves
//!   to the profile's binary. Readiness is herdr's `interactive_ready`, a dialog is its
//!   `blocked` status, typing is `agent.prompt` (herdr refuses a blocked agent).
//! - **Exit and death:** an `events.subscribe` connection on its own thread follows
//!   `pane.exited` and `pane.updated` (the exit token) for every pane — it names no pane, so a
//!   dead pane can never make it fail — and reconciles with `pane.list` after every (re)connect
//!   and every few seconds. Events about panes this fleetd did not launch are ignored; herdr
//!   replays past events on every subscribe, and a replayed fact about one of ours changes
//!   nothing (pane ids are never reused). An agent's death is its name released while the pane
//!   shell is back in the foreground (`agent.get`, `pane.process_info`): herdr reports no status.
//! - **Reading** is `pane.read` of `recent_unwrapped` (soft wraps joined, so a line typed into a
//!   narrow pane reads back whole), asked for enough rows to cover the blank bottom of the
//!   screen, trailing blank lines dropped (herdr caps a read at 1,000 rows).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::sanitize::sanitize;
use super::{Launch, Multiplexer, PaneError, PaneId, PaneState};

const BACKEND: &str = "herdr";
/// Protocol numbers this backend speaks (herdr 0.8.2 is 20; 0.9.x reports 22).
pub const PROTOCOLS: std::ops::RangeInclusive<u64> = 20..=22;
/// herdr's agent kinds and the binary each runs (`agent.start`'s reply, herdr 0.8.2).
const AGENTS: &[(&str, &str)] = &[
    ("pi", "pi"),
    ("claude", "claude"),
    ("codex", "codex"),
    ("gemini", "gemini"),
    ("cursor-agent", "cursor"),
    ("devin", "devin"),
    ("agy", "agy"),
    ("cline", "cline"),
    ("omp", "omp"),
    ("mastracode", "mastracode"),
    ("opencode", "opencode"),
    ("copilot", "copilot"),
    ("kimi", "kimi"),
    ("kiro-cli", "kiro"),
    ("droid", "droid"),
    ("amp", "amp"),
    ("grok", "grok"),
    ("hermes", "hermes"),
    ("kilo", "kilo"),
    ("qodercli", "qodercli"),
    ("qwen", "qwen"),
    ("maki", "maki"),
];
/// The label of the workspace fleetd opens its tabs in.
pub const WORKSPACE: &str = "fleetd";
/// The line typed into a new pane's shell: it replaces the shell with the command's script.
const RUN_LINE: &str = " exec /bin/sh -c \"$FLEETD_RUN\"";
/// The pane token a command's script records its exit status in.
const EXIT_TOKEN: &str = "fleetd_exit";
/// The pane token naming the agent fleetd started in it.
const AGENT_TOKEN: &str = "fleetd_agent";
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long herdr keeps an `agent.start` launch pending (its maximum): fleetd's own readiness
/// gate decides, with the profile's timeout.
const AGENT_START_MS: u64 = 300_000;
/// How often the subscription's state is checked against `pane.list`.
const RECONCILE_EVERY: Duration = Duration::from_secs(2);
/// How long an exit without a status waits for the status token (herdr sends `pane_exited`
/// before the `pane_updated` that carries it).
const STATUS_GRACE: Duration = Duration::from_millis(1500);
/// How long an exited pane is remembered after herdr dropped it.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Rows of a `pane.read` beyond those asked for: the blank bottom of the screen.
const SCREEN_ROWS: usize = 300;
/// herdr's cap on one read.
const READ_CAP: usize = 1000;

/// A herdr server reached over its socket.
#[derive(Debug)]
pub struct Herdr {
    socket: PathBuf,
    next: AtomicU64,
    /// The `fleetd` workspace's id, once found or created (one launch at a time looks).
    place: Mutex<Option<String>>,
    /// What this fleetd launched, and what the subscription learnt of it.
    ours: Arc<Mutex<Ours>>,
    /// Ends the subscription thread when the backend is dropped.
    stop: Arc<AtomicBool>,
}

/// The panes this fleetd launched (or found again by their tokens), and their exits.
#[derive(Debug, Default)]
struct Ours {
    /// Pane id → the agent name fleetd gave it (`None`: a command).
    panes: HashMap<String, Option<String>>,
    /// Panes whose process ended: the status (when the script recorded it) and when it was seen.
    exited: HashMap<String, Exit>,
    /// Subscriptions opened so far (1 + reconnects).
    subscriptions: u64,
}

#[derive(Clone, Copy, Debug)]
struct Exit {
    /// The script's `fleetd_exit` token, once it arrived.
    status: Option<i32>,
    seen: Instant,
}

impl Drop for Herdr {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Where herdr's socket is, as herdr itself finds it.
pub fn socket_path() -> Option<PathBuf> {
    socket_path_from(|name| std::env::var_os(name))
}

/// [`socket_path`] with the environment given as a lookup.
fn socket_path_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(path) = set("HERDR_SOCKET_PATH") {
        return Some(PathBuf::from(path));
    }
    let config = match set("XDG_CONFIG_HOME") {
        Some(config) => Path::new(&config).join("herdr"),
        None => Path::new(&set("HOME")?).join(".config/herdr"),
    };
    Some(match set("HERDR_SESSION") {
        Some(session) => config.join("sessions").join(session).join("herdr.sock"),
        None => config.join("herdr.sock"),
    })
}

/// The herdr agent kind whose binary `program` names (its file name), if any.
pub fn agent_kind(program: &str) -> Option<&'static str> {
    let name = Path::new(program).file_name()?.to_str()?;
    AGENTS
        .iter()
        .find(|(binary, _)| *binary == name)
        .map(|(_, kind)| *kind)
}

impl Herdr {
    /// With `pid`, refuses when the pane's process is no longer it (asked first: herdr has no
    /// conditional typing).
    fn still_runs(&self, pane: &PaneId, pid: Option<u32>) -> Result<(), PaneError> {
        match pid {
            Some(pid) => super::same_process(pane, self.pid(pane)?, pid),
            None => Ok(()),
        }
    }

    /// Opens the server at `socket` and checks its protocol with `ping`.
    pub fn open(socket: &Path) -> Result<Herdr, PaneError> {
        let herdr = Herdr {
            socket: socket.to_owned(),
            next: AtomicU64::new(1),
            place: Mutex::new(None),
            ours: Arc::new(Mutex::new(Ours::default())),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let pong = herdr.call("ping", json!({}))?;
        match pong.get("protocol").and_then(Value::as_u64) {
            Some(p) if PROTOCOLS.contains(&p) => {
                herdr.subscribe();
                Ok(herdr)
            }
            other => Err(PaneError::Unavailable {
                backend: BACKEND,
                op: "ping",
                detail: format!(
                    "herdr speaks protocol {}, this fleetd speaks {}-{}",
                    other.map_or("(none)".to_owned(), |p| p.to_string()),
                    PROTOCOLS.start(),
                    PROTOCOLS.end()
                ),
            }),
        }
    }

    /// One request on its own connection; the `result` object, or the error.
    fn call(&self, method: &'static str, params: Value) -> Result<Value, PaneError> {
        let id = format!("fleetd-{}", self.next.fetch_add(1, Ordering::Relaxed));
        request(&self.socket, &id, method, params)
    }

    /// How many times the event subscription has been opened (1 + reconnects).
    pub fn subscriptions(&self) -> u64 {
        self.ours.lock().map_or(0, |o| o.subscriptions)
    }

    /// Keeps an `events.subscribe` connection open on its own thread (see the module comment); a
    /// dropped connection (herdr restarted, live handoff) is reopened with backoff.
    fn subscribe(&self) {
        let (socket, ours, stop) = (
            self.socket.clone(),
            Arc::clone(&self.ours),
            Arc::clone(&self.stop),
        );
        std::thread::spawn(move || {
            let mut wait = Duration::from_millis(200);
            while !stop.load(Ordering::Relaxed) {
                if watch_events(&socket, &ours, &stop).is_ok() {
                    wait = Duration::from_millis(200);
                } else {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        });
    }

    /// A new pane in fleetd's workspace (a new, unfocused tab), with `cwd` and `env`.
    fn new_pane(&self, cwd: &str, env: &BTreeMap<String, String>) -> Result<PaneId, PaneError> {
        let mut place = self.place.lock().map_err(|_| PaneError::Unavailable {
            backend: BACKEND,
            op: "tab.create",
            detail: "poisoned lock".to_owned(),
        })?;
        for _ in 0..2 {
            if place.is_none() {
                *place = self.find_workspace()?;
            }
            let created = match place.as_deref() {
                Some(workspace) => self.call(
                    "tab.create",
                    json!({"workspace_id": workspace, "cwd": cwd, "env": env,
                           "focus": false, "label": WORKSPACE}),
                ),
                None => self.call(
                    "workspace.create",
                    json!({"cwd": cwd, "env": env, "focus": false, "label": WORKSPACE}),
                ),
            };
            match created {
                Ok(created) => {
                    if let Some(id) = created
                        .pointer("/workspace/workspace_id")
                        .and_then(Value::as_str)
                    {
                        *place = Some(id.to_owned());
                    }
                    return created
                        .pointer("/root_pane/pane_id")
                        .and_then(Value::as_str)
                        .map(|p| PaneId(p.to_owned()))
                        .ok_or_else(|| PaneError::Unavailable {
                            backend: BACKEND,
                            op: "tab.create",
                            detail: "no pane id in the reply".to_owned(),
                        });
                }
                // The workspace was closed since (its last tab closed): look again, once.
                Err(PaneError::NoPane(_)) if place.is_some() => *place = None,
                Err(error) => return Err(error),
            }
        }
        Err(PaneError::Unavailable {
            backend: BACKEND,
            op: "tab.create",
            detail: format!("the `{WORKSPACE}` workspace vanished twice while opening a tab"),
        })
    }

    /// The id of the workspace labelled `fleetd`, if there is one.
    fn find_workspace(&self) -> Result<Option<String>, PaneError> {
        let list = self.call("workspace.list", json!({}))?;
        Ok(list
            .get("workspaces")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|w| w.get("label").and_then(Value::as_str) == Some(WORKSPACE))
            .and_then(|w| w.get("workspace_id").and_then(Value::as_str))
            .map(str::to_owned))
    }

    /// The name of the agent fleetd started in `pane`: remembered, or (after a restart) read
    /// from the pane's token. `None` for a command's pane.
    fn agent_of(&self, pane: &PaneId) -> Result<Option<String>, PaneError> {
        if let Some(known) = self
            .ours
            .lock()
            .ok()
            .and_then(|o| o.panes.get(&pane.0).cloned())
        {
            return Ok(known);
        }
        let info = self
            .call("pane.get", json!({"pane_id": pane.0}))
            .map_err(|e| named(e, pane))?;
        let tokens = info.pointer("/pane/tokens");
        let agent = tokens
            .and_then(|t| t.get(AGENT_TOKEN))
            .and_then(Value::as_str)
            .map(str::to_owned);
        // A pane with neither token is not one fleetd launched: typed into as a command's.
        if (agent.is_some() || tokens.and_then(|t| t.get(EXIT_TOKEN)).is_some())
            && let Ok(mut ours) = self.ours.lock()
        {
            ours.panes.insert(pane.0.clone(), agent.clone());
        }
        Ok(agent)
    }

    /// Starts the agent `kind` in `pane` and records its name on the pane.
    fn start_agent(&self, pane: &PaneId, kind: &str, args: &[String]) -> Result<(), PaneError> {
        let mut suffix = [0u8; 4];
        getrandom::fill(&mut suffix).map_err(|e| PaneError::Refused(e.to_string()))?;
        let name = format!(
            "fleetd-{}",
            suffix
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        if let Ok(mut ours) = self.ours.lock() {
            ours.panes.insert(pane.0.clone(), Some(name.clone()));
        }
        self.call(
            "agent.start",
            json!({"name": name, "kind": kind, "pane_id": pane.0, "args": args,
                   "timeout_ms": AGENT_START_MS}),
        )?;
        self.call(
            "pane.report_metadata",
            json!({"pane_id": pane.0, "source": "fleetd", "tokens": {AGENT_TOKEN: name}}),
        )
        .map(|_| ())
    }

    /// Whether the agent in `pane` (named `name`) has ended: herdr released its name and the
    /// pane's shell is back in the foreground.
    fn agent_ended(&self, pane: &PaneId, name: &str) -> Result<bool, PaneError> {
        match self.call("agent.get", json!({"target": name})) {
            Ok(_) => return Ok(false),
            Err(PaneError::NoPane(_)) => {}
            Err(error) => return Err(error),
        }
        let info = self
            .call("pane.process_info", json!({"pane_id": pane.0}))
            .map_err(|e| named(e, pane))?;
        let shell = info
            .pointer("/process_info/shell_pid")
            .and_then(Value::as_u64);
        let foreground = info
            .pointer("/process_info/foreground_process_group_id")
            .and_then(Value::as_u64);
        Ok(shell.is_some() && shell == foreground)
    }

    /// The exit status of `pane` (of ours, ended): the script's token, waited for a moment when
    /// herdr's `pane_exited` came first; -1 when none arrives (an agent, or a killed script).
    fn status_of(&self, pane: &PaneId) -> i32 {
        let start = Instant::now();
        loop {
            let status = self
                .ours
                .lock()
                .ok()
                .and_then(|o| o.exited.get(&pane.0).and_then(|e| e.status));
            if let Some(status) = status {
                return status;
            }
            if start.elapsed() >= STATUS_GRACE {
                return -1;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The agent's `agent.get` record, when `pane` holds one fleetd started.
    fn agent_info(&self, pane: &PaneId) -> Option<Result<Value, PaneError>> {
        let name = match self.agent_of(pane) {
            Ok(Some(name)) => name,
            Ok(None) => return None,
            Err(error) => return Some(Err(error)),
        };
        Some(
            self.call("agent.get", json!({"target": name}))
                .map_err(|e| named(e, pane)),
        )
    }
}

impl Multiplexer for Herdr {
    /// The pane's shell: the process that becomes the command (`exec`), or under which herdr
    /// starts its agent.
    fn pid(&self, pane: &PaneId) -> Result<Option<u32>, PaneError> {
        let info = self
            .call("pane.process_info", json!({"pane_id": pane.0}))
            .map_err(|e| named(e, pane))?;
        Ok(info
            .pointer("/process_info/shell_pid")
            .and_then(Value::as_u64)
            .and_then(|pid| u32::try_from(pid).ok()))
    }

    fn launch(&self, launch: &Launch) -> Result<PaneId, PaneError> {
        let Some(program) = launch.argv.first() else {
            return Err(PaneError::Refused("an empty command".to_owned()));
        };
        let cwd = launch
            .cwd
            .to_str()
            .ok_or_else(|| PaneError::Refused("the working directory is not UTF-8".to_owned()))?;
        // herdr's `agent.start` runs an agent it knows from the pane's shell, outside any
        // sandbox fleetd can build: a sandboxed one runs as a command instead, behind fleetd's
        // init and in its sandbox. herdr then does not know it as its agent: the profile's ready
        // pattern decides when it is ready, as under tmux, and text goes in as typed input.
        let kind = agent_kind(program).filter(|_| launch.sandbox.is_none());
        let mut env = launch.env.clone();
        match kind {
            Some(_) => {
                if let Some(dir) = Path::new(program)
                    .parent()
                    .filter(|d| d.is_absolute())
                    .and_then(Path::to_str)
                {
                    let rest = env
                        .get("PATH")
                        .cloned()
                        .or_else(|| std::env::var("PATH").ok())
                        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".to_owned());
                    env.insert("PATH".to_owned(), format!("{dir}:{rest}"));
                }
            }
            // A command (or a sandboxed agent) runs behind fleetd's init.
            None => {
                env.insert("FLEETD_RUN".to_owned(), run_script(&launch.command()?)?);
            }
        }
        let asked = super::process::ticks_now();
        let pane = self.new_pane(cwd, &env)?;
        // Nothing is typed into a pane whose process is older than the request: herdr named a
        // pane it did not just create for fleetd (a fake or confused server). Left alone — it
        // is not fleetd's to close.
        if let Some(asked) = asked
            && let Some(pid) = self.pid(&pane)?
            && let Ok(Some(process)) = super::process::Watched::launched(pid)
            && process.started_before(asked)
        {
            return Err(PaneError::Refused(format!(
                "herdr named pane {pane}, whose process (pid {pid}) started before fleetd asked \
                 for a pane: nothing typed into it"
            )));
        }
        let started = match kind {
            Some(kind) => self.start_agent(&pane, kind, launch.argv.get(1..).unwrap_or_default()),
            None => {
                if let Ok(mut ours) = self.ours.lock() {
                    ours.panes.insert(pane.0.clone(), None);
                }
                self.call(
                    "pane.send_input",
                    json!({"pane_id": pane.0, "text": RUN_LINE, "keys": ["Enter"]}),
                )
                .map(|_| ())
            }
        };
        if let Err(error) = started {
            let _ = self.close(&pane);
            return Err(error);
        }
        Ok(pane)
    }

    fn send_text(&self, pane: &PaneId, text: &str) -> Result<(), PaneError> {
        let clean = sanitize(text.as_bytes()).text;
        match self.agent_of(pane)? {
            Some(agent) => self.call("agent.prompt", json!({"target": agent, "text": clean})),
            None => self.call(
                "pane.send_input",
                json!({"pane_id": pane.0, "text": clean, "keys": ["Enter"]}),
            ),
        }
        .map(|_| ())
        .map_err(|e| named(e, pane))
    }

    fn type_text(&self, pane: &PaneId, pid: Option<u32>, text: &str) -> Result<(), PaneError> {
        self.still_runs(pane, pid)?;
        let clean = sanitize(text.as_bytes()).text;
        self.call(
            "pane.send_input",
            json!({"pane_id": pane.0, "text": clean, "keys": []}),
        )
        .map(|_| ())
        .map_err(|e| named(e, pane))
    }

    fn press_enter(&self, pane: &PaneId, pid: Option<u32>) -> Result<(), PaneError> {
        self.still_runs(pane, pid)?;
        self.call(
            "pane.send_input",
            json!({"pane_id": pane.0, "text": "", "keys": ["Enter"]}),
        )
        .map(|_| ())
        .map_err(|e| named(e, pane))
    }

    fn read(&self, pane: &PaneId, lines: usize) -> Result<String, PaneError> {
        let rows = lines.max(1).saturating_add(SCREEN_ROWS).min(READ_CAP);
        let read = self
            .call(
                "pane.read",
                json!({"pane_id": pane.0, "source": "recent_unwrapped", "lines": rows}),
            )
            .map_err(|e| named(e, pane))?;
        let text = read
            .pointer("/read/text")
            .and_then(Value::as_str)
            .unwrap_or_default();
        Ok(last_lines(text, lines.max(1)))
    }

    fn state(&self, pane: &PaneId) -> Result<PaneState, PaneError> {
        let (known, exited) = self.ours.lock().map_or((None, false), |o| {
            (
                o.panes.get(&pane.0).cloned(),
                o.exited.contains_key(&pane.0),
            )
        });
        if exited {
            return Ok(PaneState::Exited(self.status_of(pane)));
        }
        let info = match self.call("pane.get", json!({"pane_id": pane.0})) {
            Ok(info) => info,
            // One of ours that herdr no longer lists: its process ended.
            Err(PaneError::NoPane(_)) if known.is_some() => {
                return Ok(PaneState::Exited(self.status_of(pane)));
            }
            Err(error) => return Err(named(error, pane)),
        };
        let tokens = info.pointer("/pane/tokens");
        if let Some(status) = tokens
            .and_then(|t| t.get(EXIT_TOKEN))
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
        {
            return Ok(PaneState::Exited(status));
        }
        let agent = match known {
            Some(agent) => agent,
            None => self.agent_of(pane)?,
        };
        match agent {
            Some(name) if self.agent_ended(pane, &name)? => Ok(PaneState::Exited(-1)),
            _ => Ok(PaneState::Running),
        }
    }

    fn close(&self, pane: &PaneId) -> Result<(), PaneError> {
        if let Ok(mut ours) = self.ours.lock() {
            ours.panes.remove(&pane.0);
            ours.exited.remove(&pane.0);
        }
        self.call("pane.close", json!({"pane_id": pane.0}))
            .map(|_| ())
            .map_err(|e| named(e, pane))
    }

    fn blocked(&self, pane: &PaneId) -> Option<bool> {
        let info = self.agent_info(pane)?.ok()?;
        Some(info.pointer("/agent/agent_status").and_then(Value::as_str) == Some("blocked"))
    }

    fn ready(&self, pane: &PaneId) -> Option<Result<bool, PaneError>> {
        Some(self.agent_info(pane)?.map(|info| {
            info.pointer("/agent/interactive_ready")
                .and_then(Value::as_bool)
                .unwrap_or(false)
        }))
    }

    fn list(&self) -> Result<Vec<PaneId>, PaneError> {
        Ok(pane_ids(&self.call("pane.list", json!({}))?)
            .into_iter()
            .map(PaneId)
            .collect())
    }
}

/// One request to the socket at `path` on its own connection: the `result`, or the error.
/// The longest reply line fleetd reads (a 1,000-row `pane.read` is far below it).
const MAX_REPLY: u64 = 16 << 20;

fn request(path: &Path, id: &str, method: &'static str, params: Value) -> Result<Value, PaneError> {
    let unavailable = |detail: String| PaneError::Unavailable {
        backend: BACKEND,
        op: method,
        detail,
    };
    let mut stream = UnixStream::connect(path)
        .map_err(|e| unavailable(format!("cannot connect to `{}`: {e}", path.display())))?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(TIMEOUT)))
        .map_err(|e| unavailable(e.to_string()))?;
    let mut line = json!({"id": id, "method": method, "params": params}).to_string();
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .map_err(|e| unavailable(e.to_string()))?;
    let mut reply = String::new();
    // A reply is one line, bounded: a server that never ends its line fills no memory.
    BufReader::new(std::io::Read::take(stream, MAX_REPLY))
        .read_line(&mut reply)
        .map_err(|e| unavailable(e.to_string()))?;
    let reply: Value = serde_json::from_str(&reply)
        .map_err(|_| unavailable("the reply is not JSON".to_owned()))?;
    if let Some(error) = reply.get("error") {
        let code = error.get("code").and_then(Value::as_str).unwrap_or("error");
        let message = error.get("message").and_then(Value::as_str).unwrap_or("");
        // The pane-addressed callers name the pane.
        return Err(if code.ends_with("not_found") {
            PaneError::NoPane(PaneId(String::new()))
        } else {
            unavailable(format!("{code}: {message}"))
        });
    }
    reply
        .get("result")
        .cloned()
        .ok_or_else(|| unavailable("no result".to_owned()))
}

/// The pane ids in a `pane.list` result.
fn pane_ids(list: &Value) -> HashSet<String> {
    list.get("panes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("pane_id").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// One subscription: open, reconcile, then apply pushed events until the connection ends or
/// the backend stops (`Ok`).
fn watch_events(socket: &Path, ours: &Mutex<Ours>, stop: &AtomicBool) -> Result<(), ()> {
    let mut stream = UnixStream::connect(socket).map_err(|_| ())?;
    // Types only, no pane ids: herdr refuses a whole subscription that names an unknown pane.
    let mut line = json!({"id": "fleetd-events", "method": "events.subscribe",
        "params": {"subscriptions": [{"type": "pane.exited"}, {"type": "pane.updated"}]}})
    .to_string();
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(|_| ())?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .map_err(|_| ())?;
    let mut reader = BufReader::new(stream);
    let mut ack = String::new();
    reader.read_line(&mut ack).map_err(|_| ())?;
    let acked: Value = serde_json::from_str(&ack).map_err(|_| ())?;
    if acked.get("error").is_some() {
        return Err(());
    }
    if let Ok(mut o) = ours.lock() {
        o.subscriptions += 1;
    }
    reconcile(socket, ours);
    let mut reconciled = Instant::now();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        if reconciled.elapsed() >= RECONCILE_EVERY {
            reconcile(socket, ours);
            reconciled = Instant::now();
        }
        let mut pushed = String::new();
        // Each event line bounded: a server that never ends one is dropped and reconnected.
        match std::io::Read::take(&mut reader, MAX_REPLY).read_line(&mut pushed) {
            Ok(0) => return Err(()),
            Ok(n) if n as u64 >= MAX_REPLY && !pushed.ends_with('\n') => return Err(()),
            Ok(_) => apply(ours, &pushed),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Err(()),
        }
    }
}

/// Applies one pushed event line: an exit, or the exit token, of a pane of ours.
fn apply(ours: &Mutex<Ours>, line: &str) {
    let Ok(event) = serde_json::from_str::<Value>(line) else {
        return;
    };
    let data = event.get("data").cloned().unwrap_or(Value::Null);
    let Some(pane) = data
        .pointer("/pane/pane_id")
        .or_else(|| data.get("pane_id"))
        .and_then(Value::as_str)
    else {
        return;
    };
    let Ok(mut o) = ours.lock() else { return };
    if !o.panes.contains_key(pane) {
        return;
    }
    let now = Instant::now();
    match event.get("event").and_then(Value::as_str) {
        Some("pane_exited") => {
            o.exited.entry(pane.to_owned()).or_insert(Exit {
                status: None,
                seen: now,
            });
        }
        Some("pane_updated") => {
            if let Some(status) = data
                .pointer(&format!("/pane/tokens/{EXIT_TOKEN}"))
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok())
            {
                o.exited.insert(
                    pane.to_owned(),
                    Exit {
                        status: Some(status),
                        seen: now,
                    },
                );
            }
        }
        _ => {}
    }
}

/// Panes of ours that herdr no longer lists have ended (their exit may have been missed while
/// disconnected); exits long gone are forgotten.
fn reconcile(socket: &Path, ours: &Mutex<Ours>) {
    let Ok(list) = request(socket, "fleetd-reconcile", "pane.list", json!({})) else {
        return;
    };
    let listed = pane_ids(&list);
    let Ok(mut o) = ours.lock() else { return };
    let now = Instant::now();
    let gone: Vec<String> = o
        .panes
        .keys()
        .filter(|p| !listed.contains(*p))
        .cloned()
        .collect();
    for pane in gone {
        o.exited.entry(pane).or_insert(Exit {
            status: None,
            seen: now,
        });
    }
    let stale: Vec<String> = o
        .exited
        .iter()
        .filter(|(p, e)| !listed.contains(*p) && e.seen.elapsed() > FORGET_AFTER)
        .map(|(p, _)| p.clone())
        .collect();
    for pane in stale {
        o.exited.remove(&pane);
        o.panes.remove(&pane);
    }
}

/// The script a command's pane runs (`FLEETD_RUN`): the argv, single-quoted, then its status
/// recorded on the pane before the pane ends with it.
fn run_script(argv: &[String]) -> Result<String, PaneError> {
    let words = argv
        .iter()
        .map(|a| shell_quote(a))
        .collect::<Result<Vec<_>, _>>()?
        .join(" ");
    Ok(format!(
        "unset FLEETD_RUN; {words}; s=$?; \"$HERDR_BIN_PATH\" pane report-metadata \
         \"$HERDR_PANE_ID\" --source fleetd --token \"{EXIT_TOKEN}=$s\" >/dev/null 2>&1; exit $s"
    ))
}

/// The last `n` lines of `text` that end with a non-blank one (the screen's blank bottom
/// dropped).
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .iter()
        .rposition(|l| !l.trim().is_empty())
        .map_or(0, |i| i + 1);
    let start = end.saturating_sub(n);
    let mut out = lines.get(start..end).unwrap_or_default().join("\n");
    if end > start {
        out.push('\n');
    }
    out
}

/// A "not found" error names `pane`.
fn named(error: PaneError, pane: &PaneId) -> PaneError {
    match error {
        PaneError::NoPane(_) => PaneError::NoPane(pane.clone()),
        other => other,
    }
}

/// A POSIX shell word (single-quoted: nothing in it is expanded). The script travels in the
/// environment, which cannot hold NUL: refused.
fn shell_quote(word: &str) -> Result<String, PaneError> {
    if word.contains('\0') {
        return Err(PaneError::Refused("a command word holds NUL".to_owned()));
    }
    Ok(format!("'{}'", word.replace('\'', "'\\''")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(
        pairs: &'static [(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Option<std::ffi::OsString> {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| std::ffi::OsString::from(v))
        }
    }

    #[test]
    fn the_socket_is_found_as_herdr_finds_it() {
        const ALL: &[(&str, &str)] = &[
            ("HERDR_SOCKET_PATH", "/run/h.sock"),
            ("XDG_CONFIG_HOME", "/cfg"),
            ("HOME", "/home/a"),
        ];
        assert_eq!(
            socket_path_from(env(ALL)),
            Some(PathBuf::from("/run/h.sock"))
        );
        assert_eq!(
            socket_path_from(env(&[("XDG_CONFIG_HOME", "/cfg"), ("HOME", "/home/a")])),
            Some(PathBuf::from("/cfg/herdr/herdr.sock"))
        );
        assert_eq!(
            socket_path_from(env(&[("HERDR_SOCKET_PATH", ""), ("HOME", "/home/a")])),
            Some(PathBuf::from("/home/a/.config/herdr/herdr.sock"))
        );
        assert_eq!(
            socket_path_from(env(&[("HERDR_SESSION", "work"), ("HOME", "/home/a")])),
            Some(PathBuf::from(
                "/home/a/.config/herdr/sessions/work/herdr.sock"
            ))
        );
        assert_eq!(
            socket_path_from(env(&[
                ("HERDR_SESSION", "work"),
                ("HERDR_SOCKET_PATH", "/run/h.sock")
            ])),
            Some(PathBuf::from("/run/h.sock"))
        );
        assert_eq!(socket_path_from(env(&[])), None);
    }

    #[test]
    fn agents_are_known_by_herdrs_binary_names() {
        assert_eq!(agent_kind("/opt/x/claude"), Some("claude"));
        assert_eq!(agent_kind("cursor-agent"), Some("cursor"));
        assert_eq!(agent_kind("/usr/bin/kiro-cli"), Some("kiro"));
        assert_eq!(agent_kind("cursor"), None);
        assert_eq!(agent_kind("/bin/sh"), None);
    }

    #[test]
    fn a_commands_script_quotes_every_word_and_records_its_status() {
        let script = run_script(&["/bin/echo".to_owned(), "it's $HOME\nnext".to_owned()]).unwrap();
        assert!(
            script.starts_with("unset FLEETD_RUN; '/bin/echo' 'it'\\''s $HOME\nnext'; s=$?;"),
            "{script}"
        );
        assert!(script.ends_with("exit $s"), "{script}");
        assert!(run_script(&["a\0b".to_owned()]).is_err());
    }

    #[test]
    fn reads_drop_the_blank_bottom_of_the_screen() {
        assert_eq!(last_lines("a\nb\nc\n\n\n   \n", 2), "b\nc\n");
        assert_eq!(last_lines("a\n", 5), "a\n");
        assert_eq!(last_lines("\n\n", 5), "");
    }
}

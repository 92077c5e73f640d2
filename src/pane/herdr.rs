//! The herdr backend, over herdr's socket API: newline-delimited JSON, one request per
//! connection (`{"id","method","params"}` → `{"id","result"}` or `{"id","error":{code,message}}`).
//!
//! - The socket is found as herdr finds it: `HERDR_SOCKET_PATH`, then
//!   `$XDG_CONFIG_HOME/herdr/herdr.sock`, then `~/.config/herdr/herdr.sock`.
//! - `ping`'s protocol number is checked when the backend is opened.
//! - Launch: `pane.split {direction, cwd, env}` (the environment never on an argv), then the
//!   command: `agent.start {name, kind, pane_id, args}` when argv[0] names an agent kind herdr
//!   knows, else `pane.send_input` of the shell-quoted argv and Enter.
//! - Typing: sanitised, then `agent.prompt` for an agent pane (herdr refuses a blocked agent),
//!   else `pane.send_input` with Enter. Reading: `pane.read` (`recent`). Closing: `pane.close`.
//!
//! Not yet: the `events.subscribe` connection with reconnect and periodic reconciliation, and
//! readiness by `agent.get` `interactive_ready` (the spawn gate uses the profile's pattern).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::sanitize::sanitize;
use super::{Launch, Multiplexer, PaneError, PaneId, PaneState};

const BACKEND: &str = "herdr";
/// Protocol numbers this backend speaks (herdr 0.8.2 is 20; 0.9.x reports 22).
pub const PROTOCOLS: std::ops::RangeInclusive<u64> = 20..=22;
/// Agent kinds herdr knows how to start and watch (its docs, 0.8.2).
const KINDS: &[&str] = &[
    "pi",
    "claude",
    "codex",
    "gemini",
    "cursor",
    "devin",
    "agy",
    "cline",
    "omp",
    "mastracode",
    "opencode",
    "copilot",
    "kimi",
    "kiro",
    "droid",
    "amp",
    "grok",
    "hermes",
    "kilo",
    "qodercli",
    "qwen",
    "maki",
];
const TIMEOUT: Duration = Duration::from_secs(5);
/// How often the subscription's state is checked against `pane.list`.
const RECONCILE_EVERY: Duration = Duration::from_secs(5);

/// A herdr server reached over its socket.
#[derive(Debug)]
pub struct Herdr {
    socket: PathBuf,
    next: AtomicU64,
    /// Panes where fleetd started an agent: pane id → agent name (the `agent.prompt` target).
    agents: Arc<Mutex<HashMap<String, String>>>,
    /// What the event subscription has learnt.
    events: Arc<Mutex<Events>>,
    /// Ends the subscription thread when the backend is dropped.
    stop: Arc<AtomicBool>,
}

/// State learnt from `events.subscribe`, reconciled with `pane.list` after every (re)connect.
#[derive(Debug, Default)]
struct Events {
    /// Panes whose process exited, with the status herdr reported (-1: none given).
    exited: HashMap<String, i32>,
    /// Agent status per pane (`idle`, `working`, `blocked`, `done`, `unknown`).
    status: HashMap<String, String>,
    /// Subscriptions opened so far (1 + reconnects).
    subscriptions: u64,
    /// The subscription must be reopened (a new agent pane to watch).
    renew: bool,
}

impl Drop for Herdr {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Where herdr's socket is: `HERDR_SOCKET_PATH`, `$XDG_CONFIG_HOME/herdr/herdr.sock`,
/// `~/.config/herdr/herdr.sock`.
pub fn socket_path() -> Option<PathBuf> {
    socket_path_from(|name| std::env::var_os(name))
}

/// [`socket_path`] with the environment given as a lookup.
fn socket_path_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(path) = set("HERDR_SOCKET_PATH") {
        return Some(PathBuf::from(path));
    }
    if let Some(config) = set("XDG_CONFIG_HOME") {
        return Some(Path::new(&config).join("herdr/herdr.sock"));
    }
    set("HOME").map(|home| Path::new(&home).join(".config/herdr/herdr.sock"))
}

impl Herdr {
    /// Opens the server at `socket` and checks its protocol with `ping`.
    pub fn open(socket: &Path) -> Result<Herdr, PaneError> {
        let herdr = Herdr {
            socket: socket.to_owned(),
            next: AtomicU64::new(1),
            agents: Arc::new(Mutex::new(HashMap::new())),
            events: Arc::new(Mutex::new(Events::default())),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let pong = herdr.call("ping", json!({}))?;
        let protocol = pong.get("protocol").and_then(Value::as_u64);
        match protocol {
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
        let unavailable = |detail: String| PaneError::Unavailable {
            backend: BACKEND,
            op: method,
            detail,
        };
        let id = format!("fleetd-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let mut stream = UnixStream::connect(&self.socket).map_err(|e| {
            unavailable(format!(
                "cannot connect to `{}`: {e}",
                self.socket.display()
            ))
        })?;
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
        BufReader::new(stream)
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

    /// How many times the event subscription has been opened (1 + reconnects).
    pub fn subscriptions(&self) -> u64 {
        self.events.lock().map_or(0, |e| e.subscriptions)
    }

    /// Keeps an `events.subscribe` connection open on its own thread: pane exits and closes,
    /// and the status of every agent pane fleetd started. A dropped connection (herdr restarted,
    /// live handoff) is reopened with backoff; after every (re)open the state is reconciled with
    /// `pane.list`, so nothing missed while disconnected lingers.
    fn subscribe(&self) {
        let (socket, agents, events, stop) = (
            self.socket.clone(),
            Arc::clone(&self.agents),
            Arc::clone(&self.events),
            Arc::clone(&self.stop),
        );
        std::thread::spawn(move || {
            let mut wait = Duration::from_millis(200);
            while !stop.load(Ordering::Relaxed) {
                if watch_events(&socket, &agents, &events, &stop).is_ok() {
                    wait = Duration::from_millis(200);
                } else {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        });
    }

    fn agent_of(&self, pane: &PaneId) -> Option<String> {
        self.agents.lock().ok()?.get(&pane.0).cloned()
    }
}

impl Multiplexer for Herdr {
    fn launch(&self, launch: &Launch) -> Result<PaneId, PaneError> {
        let Some(program) = launch.argv.first() else {
            return Err(PaneError::Refused("an empty command".to_owned()));
        };
        let cwd = launch
            .cwd
            .to_str()
            .ok_or_else(|| PaneError::Refused("the working directory is not UTF-8".to_owned()))?;
        let split = self.call(
            "pane.split",
            json!({"direction": "right", "cwd": cwd, "env": launch.env, "focus": false}),
        )?;
        let pane = split
            .pointer("/pane/pane_id")
            .and_then(Value::as_str)
            .map(|p| PaneId(p.to_owned()))
            .ok_or_else(|| PaneError::Unavailable {
                backend: BACKEND,
                op: "pane.split",
                detail: "no pane id in the reply".to_owned(),
            })?;
        let kind = Path::new(program)
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|k| KINDS.contains(k));
        let started = match kind {
            Some(kind) => {
                let mut suffix = [0u8; 4];
                getrandom::fill(&mut suffix).map_err(|e| PaneError::Refused(e.to_string()))?;
                let name = format!(
                    "fleetd-{}",
                    suffix
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                );
                let args: Vec<&String> = launch.argv.iter().skip(1).collect();
                let started = self.call(
                    "agent.start",
                    json!({"name": name, "kind": kind, "pane_id": pane.0, "args": args}),
                );
                if started.is_ok()
                    && let Ok(mut agents) = self.agents.lock()
                {
                    agents.insert(pane.0.clone(), name);
                    if let Ok(mut events) = self.events.lock() {
                        events.renew = true;
                    }
                }
                started.map(|_| ())
            }
            None => {
                let line = launch
                    .argv
                    .iter()
                    .map(|a| shell_quote(a))
                    .collect::<Result<Vec<_>, _>>()?
                    .join(" ");
                self.call(
                    "pane.send_input",
                    json!({"pane_id": pane.0, "text": line, "keys": ["Enter"]}),
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
        match self.agent_of(pane) {
            Some(agent) => self.call("agent.prompt", json!({"target": agent, "text": clean})),
            None => self.call(
                "pane.send_input",
                json!({"pane_id": pane.0, "text": clean, "keys": ["Enter"]}),
            ),
        }
        .map(|_| ())
        .map_err(|e| named(e, pane))
    }

    fn read(&self, pane: &PaneId, lines: usize) -> Result<String, PaneError> {
        let read = self
            .call(
                "pane.read",
                json!({"pane_id": pane.0, "source": "recent", "lines": lines.max(1)}),
            )
            .map_err(|e| named(e, pane))?;
        Ok(read
            .pointer("/read/text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned())
    }

    fn state(&self, pane: &PaneId) -> Result<PaneState, PaneError> {
        if let Some(status) = self
            .events
            .lock()
            .ok()
            .and_then(|e| e.exited.get(&pane.0).copied())
        {
            return Ok(PaneState::Exited(status));
        }
        let info = self
            .call("pane.get", json!({"pane_id": pane.0}))
            .map_err(|e| named(e, pane))?;
        let exited = info
            .pointer("/pane/exited")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(if exited {
            let status = info
                .pointer("/pane/exit_code")
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok())
                .unwrap_or(-1);
            PaneState::Exited(status)
        } else {
            PaneState::Running
        })
    }

    fn close(&self, pane: &PaneId) -> Result<(), PaneError> {
        if let Ok(mut agents) = self.agents.lock() {
            agents.remove(&pane.0);
        }
        self.call("pane.close", json!({"pane_id": pane.0}))
            .map(|_| ())
            .map_err(|e| named(e, pane))
    }

    fn blocked(&self, pane: &PaneId) -> Option<bool> {
        let events = self.events.lock().ok()?;
        events.status.get(&pane.0).map(|s| s == "blocked")
    }

    fn ready(&self, pane: &PaneId) -> Option<Result<bool, PaneError>> {
        let agent = self.agent_of(pane)?;
        Some(
            self.call("agent.get", json!({"target": agent}))
                .map(|info| {
                    info.pointer("/agent/interactive_ready")
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                })
                .map_err(|e| named(e, pane)),
        )
    }

    fn list(&self) -> Result<Vec<PaneId>, PaneError> {
        let list = self.call("pane.list", json!({}))?;
        Ok(list
            .get("panes")
            .and_then(Value::as_array)
            .map(|panes| {
                panes
                    .iter()
                    .filter_map(|p| p.get("pane_id").and_then(Value::as_str))
                    .map(|p| PaneId(p.to_owned()))
                    .collect()
            })
            .unwrap_or_default())
    }
}

/// One subscription: open, reconcile, then apply pushed events until the connection ends, a
/// renewal is due (a new agent pane) or the backend stops. `Ok` when it ended on purpose.
fn watch_events(
    socket: &Path,
    agents: &Mutex<HashMap<String, String>>,
    events: &Mutex<Events>,
    stop: &AtomicBool,
) -> Result<(), ()> {
    let mut stream = UnixStream::connect(socket).map_err(|_| ())?;
    let mut subscriptions = vec![
        json!({"type": "pane.exited"}),
        json!({"type": "pane.closed"}),
    ];
    let panes: Vec<String> = agents
        .lock()
        .map(|a| a.keys().cloned().collect())
        .unwrap_or_default();
    subscriptions.extend(
        panes
            .iter()
            .map(|p| json!({"type": "pane.agent_status_changed", "pane_id": p})),
    );
    let mut line = json!({"id": "fleetd-events", "method": "events.subscribe",
                          "params": {"subscriptions": subscriptions}})
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
    if let Ok(mut e) = events.lock() {
        e.subscriptions += 1;
        e.renew = false;
    }
    reconcile(socket, events);
    let mut reconciled = std::time::Instant::now();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Events can be missed (herdr's ring is bounded): reconcile every few seconds too.
        if reconciled.elapsed() >= RECONCILE_EVERY {
            reconcile(socket, events);
            reconciled = std::time::Instant::now();
        }
        if events.lock().is_ok_and(|e| e.renew) {
            return Ok(());
        }
        let mut pushed = String::new();
        match reader.read_line(&mut pushed) {
            Ok(0) => return Err(()),
            Ok(_) => apply(events, &pushed),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Err(()),
        }
    }
}

/// Applies one pushed event line.
fn apply(events: &Mutex<Events>, line: &str) {
    let Ok(event) = serde_json::from_str::<Value>(line) else {
        return;
    };
    let data = event.get("data").cloned().unwrap_or(Value::Null);
    let pane = data
        .pointer("/pane/pane_id")
        .or_else(|| data.get("pane_id"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let (Some(pane), Ok(mut e)) = (pane, events.lock()) else {
        return;
    };
    match event
        .get("event")
        .and_then(Value::as_str)
        .unwrap_or_default()
    {
        "pane_exited" | "pane.exited" => {
            let status = data
                .pointer("/pane/exit_code")
                .or_else(|| data.get("exit_code"))
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok())
                .unwrap_or(-1);
            e.exited.insert(pane, status);
        }
        "pane_closed" | "pane.closed" => {
            e.exited.remove(&pane);
            e.status.remove(&pane);
        }
        "pane_agent_status_changed" | "pane.agent_status_changed" => {
            if let Some(status) = data.get("agent_status").and_then(Value::as_str) {
                e.status.insert(pane, status.to_owned());
            }
        }
        _ => {}
    }
}

/// Forgets what is known of panes herdr no longer lists.
fn reconcile(socket: &Path, events: &Mutex<Events>) {
    let listed = (|| {
        let mut stream = UnixStream::connect(socket).ok()?;
        stream.set_read_timeout(Some(TIMEOUT)).ok()?;
        stream
            .write_all(b"{\"id\":\"fleetd-reconcile\",\"method\":\"pane.list\",\"params\":{}}\n")
            .ok()?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).ok()?;
        let reply: Value = serde_json::from_str(&line).ok()?;
        let panes = reply.pointer("/result/panes")?.as_array()?;
        Some(
            panes
                .iter()
                .filter_map(|p| p.get("pane_id").and_then(Value::as_str).map(str::to_owned))
                .collect::<std::collections::HashSet<_>>(),
        )
    })();
    if let (Some(listed), Ok(mut e)) = (listed, events.lock()) {
        e.status.retain(|pane, _| listed.contains(pane));
        e.exited.retain(|pane, _| listed.contains(pane));
    }
}

/// A "not found" error names `pane`.
fn named(error: PaneError, pane: &PaneId) -> PaneError {
    match error {
        PaneError::NoPane(_) => PaneError::NoPane(pane.clone()),
        other => other,
    }
}

/// A POSIX shell word; line breaks and NUL cannot be typed safely: refused.
fn shell_quote(word: &str) -> Result<String, PaneError> {
    if word.contains(['\n', '\r', '\0']) {
        return Err(PaneError::Refused(
            "a command word holds a line break or NUL".to_owned(),
        ));
    }
    Ok(format!("'{}'", word.replace('\'', "'\\''")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_found_as_herdr_finds_it() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
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
        assert_eq!(socket_path_from(env(&[])), None);
    }

    #[test]
    fn shell_words_are_quoted_and_line_breaks_refused() {
        assert_eq!(shell_quote("it's").unwrap(), "'it'\\''s'");
        assert!(shell_quote("a\nb").is_err());
    }
}

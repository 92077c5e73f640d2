//! The tmux backend: a dedicated server socket (`-L NAME` or `-S PATH`) that runs on its own,
//! `%N` pane ids, every call bounded by a timeout.
//!
//! Nothing secret is ever on a command line: commands that carry environment values go to
//! `tmux source-file -` on stdin (tmux's own quoting, single-quoted), and typed text goes through
//! `load-buffer -` on stdin, then `paste-buffer -p -d` (bracketed paste, buffer deleted) and
//! Enter. Panes keep their process's exit status (`remain-on-exit`).

pub mod client;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::client::{CallError, Refusal};
use super::sanitize::sanitize;
use super::{Launch, Multiplexer, PaneError, PaneId, PaneState};

const BACKEND: &str = "tmux";
/// What the paste command prints when it found the pane dead (and typed nothing).
const DEAD_PANE: &str = "fleetd-pane-dead";

/// How fleetd reaches the tmux server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Socket {
    /// `tmux -L NAME` (a socket named NAME in tmux's per-user directory).
    Name(String),
    /// `tmux -S PATH`.
    Path(PathBuf),
}

/// How many refused server requests are kept until [`Multiplexer::alarms`] takes them.
const MAX_ALARMS: usize = 64;

/// A tmux server and the session fleetd opens its windows in.
#[derive(Clone, Debug)]
pub struct Tmux {
    socket: Socket,
    session: String,
    timeout: Duration,
    /// What the server asked of fleetd's client and was refused, not yet reported.
    alarms: Arc<Mutex<Vec<String>>>,
}

impl Tmux {
    /// The server at `socket`; windows go into session `session` (created when missing).
    pub fn new(socket: Socket, session: &str) -> Tmux {
        Tmux {
            socket,
            session: session.to_owned(),
            timeout: Duration::from_secs(5),
            alarms: Arc::default(),
        }
    }

    /// The socket, for messages.
    fn describe(&self) -> String {
        match &self.socket {
            Socket::Name(name) => format!("socket name `{name}` (-L)"),
            Socket::Path(path) => format!("`{}` (-S)", path.display()),
        }
    }

    /// Runs the tmux command `args` with `stdin` through fleetd's own client; its stdout, or
    /// why it failed. What the server asked for and was refused is kept for [`Tmux::alarms`].
    fn run(&self, op: &'static str, args: &[&str], stdin: &[u8]) -> Result<String, PaneError> {
        let unavailable = |detail: String| PaneError::Unavailable {
            backend: BACKEND,
            op,
            detail,
        };
        let socket = match &self.socket {
            Socket::Name(name) => client::named_socket(name),
            Socket::Path(path) => Ok(path.clone()),
        }
        .map_err(|e| unavailable(e.to_string()))?;
        let deadline = std::time::Instant::now() + self.timeout;
        let reply = match client::call(&socket, args, stdin, deadline) {
            Ok(reply) => reply,
            Err(CallError::Hostile { refused }) => {
                self.alarm(op, &refused);
                let last = refused.last().map(ToString::to_string).unwrap_or_default();
                return Err(PaneError::Refused(format!(
                    "the tmux server asked fleetd to {last}: the call was ended"
                )));
            }
            Err(error) => return Err(unavailable(error.to_string())),
        };
        self.alarm(op, &reply.refused);
        if reply.status == 0 {
            return Ok(String::from_utf8_lossy(&reply.stdout).into_owned());
        }
        let stderr = String::from_utf8_lossy(&reply.stderr).trim().to_owned();
        Err(unavailable(match (stderr.is_empty(), reply.message) {
            (false, _) => stderr,
            (true, Some(message)) => message,
            (true, None) => format!("tmux exited with status {}", reply.status),
        }))
    }

    /// Keeps what the server asked of fleetd's client and was refused (bounded).
    fn alarm(&self, op: &'static str, refused: &[Refusal]) {
        if refused.is_empty() {
            return;
        }
        if let Ok(mut alarms) = self.alarms.lock() {
            for refusal in refused {
                if alarms.len() < MAX_ALARMS {
                    alarms.push(format!(
                        "during `{op}` the server asked fleetd to {refusal}"
                    ));
                }
            }
        }
    }

    /// Runs tmux commands given on stdin (`source-file -`): values stay off every argv.
    fn script(&self, op: &'static str, commands: &str) -> Result<String, PaneError> {
        self.run(op, &["source-file", "-"], commands.as_bytes())
    }

    /// A pane-addressed call that maps tmux's "can't find pane" to [`PaneError::NoPane`].
    fn on_pane(
        &self,
        op: &'static str,
        pane: &PaneId,
        args: &[&str],
        stdin: &[u8],
    ) -> Result<String, PaneError> {
        valid_pane(pane)?;
        self.run(op, args, stdin).map_err(|error| match error {
            PaneError::Unavailable { ref detail, .. } if detail.contains("can't find") => {
                PaneError::NoPane(pane.clone())
            }
            other => other,
        })
    }
}

impl Multiplexer for Tmux {
    fn launch(&self, launch: &Launch) -> Result<PaneId, PaneError> {
        if launch.argv.is_empty() {
            return Err(PaneError::Refused("an empty command".to_owned()));
        }
        let mut words = Vec::new();
        words.push("-c".to_owned());
        words.push(quote(&path_text(&launch.cwd)?)?);
        for (name, value) in &launch.env {
            if name.is_empty() || name.contains('=') {
                return Err(PaneError::Refused(format!(
                    "environment name `{name}` is malformed"
                )));
            }
            words.push("-e".to_owned());
            words.push(quote(&format!("{name}={value}"))?);
        }
        words.push("--".to_owned());
        for arg in &launch.command()? {
            words.push(quote(arg)?);
        }
        // The server must already run on its own (the operator's unit starts it): a server that
        // fleetd's call started would inherit fleetd's sandbox, and so would every agent.
        let exists = match self.run("has-session", &["has-session", "-t", &self.session], b"") {
            Ok(_) => true,
            Err(PaneError::Unavailable { detail, .. })
                if detail.contains("no server running") || detail.contains("error connecting") =>
            {
                return Err(PaneError::Unavailable {
                    backend: BACKEND,
                    op: "launch",
                    detail: format!(
                        "no tmux server runs at {}: start it outside fleetd (deploy/fleetd-tmux@.service)",
                        self.describe()
                    ),
                });
            }
            Err(_) => false,
        };
        let words = words.join(" ");
        let (script, window) = self.launch_script(&words, exists)?;
        let (out, window) = match self.script("launch", &script) {
            // Another launch created the session a moment ago: open the window in it.
            Err(PaneError::Unavailable { detail, .. })
                if !exists && detail.contains("duplicate session") =>
            {
                let (script, window) = self.launch_script(&words, true)?;
                (self.script("launch", &script)?, window)
            }
            other => (other?, window),
        };
        // The id comes on the line that starts with the new window's unique name: whatever a
        // hook prints beside it (`display-message -p '%0'`) names no pane of fleetd's.
        let id = out.lines().find_map(|l| {
            l.strip_prefix(&window)
                .and_then(|rest| rest.strip_prefix(' '))
                .filter(|id| valid_pane(&PaneId((*id).to_owned())).is_ok())
        });
        match id {
            Some(id) => Ok(PaneId(id.to_owned())),
            None => Err(PaneError::Unavailable {
                backend: BACKEND,
                op: "launch",
                detail: "tmux did not print the new pane id".to_owned(),
            }),
        }
    }

    fn send_text(&self, pane: &PaneId, text: &str) -> Result<(), PaneError> {
        self.paste(pane, None, text, true)
    }

    fn send_text_to(&self, pane: &PaneId, pid: u32, text: &str) -> Result<(), PaneError> {
        self.paste(pane, Some(pid), text, true)
    }

    fn type_text(&self, pane: &PaneId, pid: Option<u32>, text: &str) -> Result<(), PaneError> {
        self.paste(pane, pid, text, false)
    }

    fn press_enter(&self, pane: &PaneId, pid: Option<u32>) -> Result<(), PaneError> {
        let keys = format!("send-keys -t {pane} Enter");
        let skip = format!("display-message -p {DEAD_PANE}");
        let pressed = self.on_pane(
            "send-keys",
            pane,
            &["if-shell", "-F", "-t", &pane.0, &skip_if(pid), &skip, &keys],
            b"",
        )?;
        if pressed.contains(DEAD_PANE) {
            return Err(not_typed(pane, pid));
        }
        Ok(())
    }

    fn pid(&self, pane: &PaneId) -> Result<Option<u32>, PaneError> {
        let fields = self.pane_line(pane, "#{pane_pid}")?;
        Ok(fields.first().and_then(|p| p.parse().ok()))
    }

    fn read(&self, pane: &PaneId, lines: usize) -> Result<String, PaneError> {
        let start = format!("-{}", lines.max(1));
        self.on_pane(
            "capture-pane",
            pane,
            &["capture-pane", "-p", "-J", "-t", &pane.0, "-S", &start],
            b"",
        )
    }

    fn state(&self, pane: &PaneId) -> Result<PaneState, PaneError> {
        valid_pane(pane)?;
        // tmux marks a pane dead when its terminal closes, which can come a moment before the
        // process is reaped and its status known: ask again briefly before saying "unknown".
        for attempt in 0..20 {
            let (dead, status) = self.pane_fields(pane)?;
            match (dead, status) {
                (false, _) => return Ok(PaneState::Running),
                (true, Some(status)) => return Ok(PaneState::Exited(status)),
                (true, None) if attempt < 19 => {
                    if attempt % 4 == 3 {
                        self.reap()?;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                (true, None) => break,
            }
        }
        Ok(PaneState::Exited(-1))
    }

    fn close(&self, pane: &PaneId) -> Result<(), PaneError> {
        self.on_pane("kill-pane", pane, &["kill-pane", "-t", &pane.0], b"")
            .map(|_| ())
    }

    fn list(&self) -> Result<Vec<PaneId>, PaneError> {
        let out = self.run("list-panes", &["list-panes", "-a", "-F", "#{pane_id}"], b"")?;
        Ok(out
            .lines()
            .filter(|l| l.starts_with('%'))
            .map(|l| PaneId(l.trim().to_owned()))
            .collect())
    }

    fn alarms(&self) -> Vec<String> {
        self.alarms
            .lock()
            .map(|mut alarms| std::mem::take(&mut *alarms))
            .unwrap_or_default()
    }
}

impl Tmux {
    /// Loads `text` (sanitised) into a private buffer and pastes it, with Enter when `enter` —
    /// only into a live pane and, with `pid`, only while that is the pane's process.
    fn paste(
        &self,
        pane: &PaneId,
        pid: Option<u32>,
        text: &str,
        enter: bool,
    ) -> Result<(), PaneError> {
        let clean = sanitize(text.as_bytes());
        let buffer = unique_name("fleetd")?;
        self.run(
            "load-buffer",
            &["load-buffer", "-b", &buffer, "-"],
            clean.text.as_bytes(),
        )?;
        // Paste and Enter in one command list: the server runs both in one go, so a fleetd
        // killed meanwhile never leaves a pasted line without its Enter (which the next message
        // would be appended to). And only into a live pane, decided in the same go: tmux 3.3a
        // crashes — every session with it — when it pastes into a pane whose process has exited
        // (remain-on-exit keeps the pane, without its terminal). The server does not handle a
        // child's exit between `if-shell -F`'s check and the paste.
        let mut paste = format!("paste-buffer -p -d -b {buffer} -t {pane}");
        if enter {
            paste.push_str(&format!(" ; send-keys -t {pane} Enter"));
        }
        let skip = format!("delete-buffer -b {buffer} ; display-message -p {DEAD_PANE}");
        let pasted = self.on_pane(
            "paste-buffer",
            pane,
            &[
                "if-shell",
                "-F",
                "-t",
                &pane.0,
                &skip_if(pid),
                &skip,
                &paste,
            ],
            b"",
        );
        match pasted {
            Ok(out) if out.contains(DEAD_PANE) => Err(not_typed(pane, pid)),
            Ok(_) => Ok(()),
            Err(error) => {
                let _ = self.run("delete-buffer", &["delete-buffer", "-b", &buffer], b"");
                Err(error)
            }
        }
    }

    /// The `source-file` script that opens a window running `words` (`-c`, `-e`, `--`, argv,
    /// quoted) and prints its pane id behind the window's unique name; and that name.
    ///
    /// The agent's environment goes on its own window (`new-window -e`), never on the session:
    /// `new-session -e` would set the *session's* environment, which every later window
    /// inherits (one agent's secrets in the next agent's pane). So a missing session is created
    /// with a neutral placeholder window, closed again once the agent's window exists.
    /// `remain-on-exit` is set on the agent's window alone (never the server-wide default, which
    /// would change the user's other windows), in the same command queue as `new-window`: the
    /// server runs the queue without handling the child's exit in between, so a process that
    /// ends at once still leaves its status behind.
    fn launch_script(
        &self,
        words: &str,
        session_exists: bool,
    ) -> Result<(String, String), PaneError> {
        let session = quote(&self.session)?;
        let window = unique_name("fleetd")?;
        let target = quote(&format!("{}:{window}", self.session))?;
        let mut script = String::new();
        let placeholder = if session_exists {
            None
        } else {
            let hold = unique_name("fleetd-hold")?;
            script.push_str(&format!("new-session -d -s {session} -n {hold}\n"));
            Some(quote(&format!("{}:{hold}", self.session))?)
        };
        script.push_str(&format!(
            "new-window -d -t {session}: -n {window} -P -F '{window} #{{pane_id}}' {words}\n\
             set-option -w -t {target} remain-on-exit on\n"
        ));
        if let Some(hold) = placeholder {
            script.push_str(&format!("kill-window -t {hold}\n"));
        }
        Ok((script, window))
    }

    /// Makes the server reap children it was not told about. tmux built with libutempter (as
    /// Debian's 3.3a is) sets SIGCHLD to its default while its utmp helper runs when a pane's
    /// terminal closes; a pane process that exits in that moment loses its SIGCHLD and stays a
    /// zombie, its status unknown, until some other child of the server exits (seen under load;
    /// docs/panes.md). `run-shell true` makes such a child, and the server's SIGCHLD handler then
    /// reaps every zombie.
    fn reap(&self) -> Result<(), PaneError> {
        self.run("run-shell", &["run-shell", "true"], b"")
            .map(|_| ())
    }

    /// Whether `pane` is dead, and its exit status once tmux knows it.
    fn pane_fields(&self, pane: &PaneId) -> Result<(bool, Option<i32>), PaneError> {
        let fields = self.pane_line(pane, "#{pane_dead} #{pane_dead_status}")?;
        let dead = fields.first().is_some_and(|d| d == "1");
        Ok((dead, fields.get(1).and_then(|s| s.parse().ok())))
    }

    /// `pane`'s fields in `format` (space-separated), from `list-panes -a`: `display-message
    /// -t` on a missing pane prints nothing and succeeds, a listing says it is gone.
    fn pane_line(&self, pane: &PaneId, format: &str) -> Result<Vec<String>, PaneError> {
        valid_pane(pane)?;
        let format = format!("#{{pane_id}} {format}");
        let out = self.run("list-panes", &["list-panes", "-a", "-F", &format], b"")?;
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(pane.0.as_str()))
            .ok_or_else(|| PaneError::NoPane(pane.clone()))?;
        Ok(line.split_whitespace().skip(1).map(str::to_owned).collect())
    }
}

/// `PREFIX-` and 16 random hex digits: a window name no other window has.
/// The `if-shell -F` condition under which nothing is typed: a dead pane, or one whose process
/// is no longer the agent's `pid`.
fn skip_if(pid: Option<u32>) -> String {
    match pid {
        Some(pid) => format!("#{{||:#{{pane_dead}},#{{!=:#{{pane_pid}},{pid}}}}}"),
        None => "#{pane_dead}".to_owned(),
    }
}

/// Why nothing was typed into `pane` (see [`skip_if`]).
fn not_typed(pane: &PaneId, pid: Option<u32>) -> PaneError {
    PaneError::Refused(match pid {
        Some(pid) => {
            format!("pane {pane}'s process has exited or is no longer pid {pid}: nothing typed")
        }
        None => format!("pane {pane}'s process has exited: nothing typed"),
    })
}

fn unique_name(prefix: &str) -> Result<String, PaneError> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| PaneError::Refused(e.to_string()))?;
    Ok(format!(
        "{prefix}-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// A word in tmux's command language, single-quoted (no expansion inside), with `'` spliced as
/// `'"'"'`. Line breaks and NUL cannot be carried safely: refused.
fn quote(word: &str) -> Result<String, PaneError> {
    if word.contains(['\n', '\r', '\0']) {
        return Err(PaneError::Refused(
            "a command word, path or environment value holds a line break or NUL".to_owned(),
        ));
    }
    Ok(format!("'{}'", word.replace('\'', "'\"'\"'")))
}

fn path_text(path: &Path) -> Result<String, PaneError> {
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| PaneError::Refused("the working directory is not UTF-8".to_owned()))
}

/// Pane ids are `%` and digits: anything else never reaches a tmux target.
fn valid_pane(pane: &PaneId) -> Result<(), PaneError> {
    let digits = pane.0.strip_prefix('%').unwrap_or("");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PaneError::NoPane(pane.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_single_quoted_and_line_breaks_refused() {
        assert_eq!(quote("plain").unwrap(), "'plain'");
        assert_eq!(quote("it's $HOME").unwrap(), "'it'\"'\"'s $HOME'");
        assert!(quote("two\nlines").is_err());
        assert!(quote("nul\0").is_err());
    }

    #[test]
    fn only_percent_digit_pane_ids_are_targets() {
        assert!(valid_pane(&PaneId("%12".to_owned())).is_ok());
        for bad in ["12", "%", "%1;kill-server", "main:0", "%1 "] {
            assert!(valid_pane(&PaneId(bad.to_owned())).is_err(), "{bad}");
        }
    }
}

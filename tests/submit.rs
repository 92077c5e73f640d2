//! Delivered means submitted, over both multiplexers (`[profile.P.ready] input`): a TUI that
//! drops the Enter following a paste — as Claude Code 2.1.197 does for its first message — gets
//! it pressed again, each message counts as `delivered` only once the agent took it, and no two
//! are glued into one turn. The real CLIs: `tests/real_agents.rs`.
//!
//! The agent is a scripted stand-in beside the real ones: a raw-mode TUI (Python) with an input
//! line `> ` at the bottom, bracketed paste (mode 2004 on), a transcript above (`you said: …`), and Claude
//! Code's fault made deterministic — the first Enter within 0.3 s of a paste's end is dropped
//! (and counted in a file, so that the test knows the fault happened); in `deaf` mode every
//! Enter is, until a file says otherwise.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::Duration;

use common::{eventually, spawn_logged, wait_for};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

/// The stand-in TUI (see the module comment). Its arguments: the file it counts dropped Enters
/// in, and its mode (`first` or `deaf`).
const TUI: &str = r#"
import os, sys, time, tty
drops, mode = sys.argv[1], sys.argv[2]
tty.setraw(0)
def out(s): os.write(1, s.encode())
line, paste, paste_end, dropped = b"", False, 0.0, False
# The input line scrolls sideways (its last 70 characters), as a TUI's input field does, so it
# never wraps in a narrow pane.
def draw(): out("\r\x1b[K> " + line.decode("utf-8", "replace")[-70:])
out("\x1b[?2004h"); out("tui ready\r\n"); draw()
buf = b""
while True:
    data = os.read(0, 4096)
    if not data: break
    buf += data
    while buf:
        if buf.startswith(b"\x1b[200~"):
            paste, buf = True, buf[6:]; continue
        if buf.startswith(b"\x1b[201~"):
            paste, paste_end, buf = False, time.time(), buf[6:]; continue
        if len(buf) < 6 and (b"\x1b[200~".startswith(buf) or b"\x1b[201~".startswith(buf)):
            break
        ch, buf = buf[:1], buf[1:]
        if ch in (b"\r", b"\n") and not paste:
            deaf = mode == "deaf" and not os.path.exists(drops + ".hear")
            if deaf or (not dropped and time.time() - paste_end < 0.3):
                dropped = True
                open(drops, "a").write("dropped\n")
                continue
            out("\r\x1b[Kyou said: " + line.decode("utf-8", "replace") + "\r\n"); line = b""
        elif ch in (b"\r", b"\n"):
            line += b" "
        else:
            line += ch
    draw()
"#;

/// A single-host daemon with a `tui` profile whose input line is `^>` (the stand-in and its
/// files in its root: all its sandbox lets it write).
struct Host {
    dir: tempfile::TempDir,
    daemon: Option<Child>,
    _log: mpsc::Receiver<String>,
}

impl Host {
    fn start(config: &str, env: &[(&str, &str)]) -> Host {
        Host::start_in_mode(config, env, "first")
    }

    fn start_in_mode(config: &str, env: &[(&str, &str)], mode: &str) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("config/fleetd/policy")).unwrap();
        std::fs::create_dir_all(root.join("work")).unwrap();
        std::fs::create_dir_all(root.join("tmux")).unwrap();
        std::fs::write(root.join("work/tui.py"), TUI).unwrap();
        std::fs::write(root.join("config/fleetd/fleetd.toml"), config).unwrap();
        std::fs::write(
            root.join("config/fleetd/policy/00-tui.toml"),
            format!(
                "[profile.tui]\ndescription = \"A TUI that drops an Enter after a paste.\"\n\
                 argv = [\"/usr/bin/python3\", \"{py}\", \"{drops}\", \"{mode}\"]\nroots = [\"{work}\"]\n\
                 [profile.tui.ready]\npattern = \"^>\"\ninput = \"^>\"\ntimeout_secs = 30\n\n\
                 [profile.line]\ndescription = \"Reads lines.\"\n\
                 argv = [\"/bin/sh\", \"-c\", \"echo ready; while read -r l; do echo \\\"got:$l\\\"; done\"]\n\
                 roots = [\"{work}\"]\n\
                 [profile.line.ready]\npattern = \"^ready\"\ntimeout_secs = 30\n\n\
                 [[grant]]\nid = \"own\"\ndescription = \"The operator's.\"\n\
                 fleets = [\"local\"]\nprofiles = [\"tui\", \"line\"]\n",
                py = root.join("work/tui.py").display(),
                drops = root.join("work/drops").display(),
                work = root.join("work").display(),
            ),
        )
        .unwrap();
        let mut run = Command::new(BIN);
        run.arg("run");
        let mut host = Host {
            dir,
            daemon: None,
            _log: mpsc::channel().1,
        };
        let (child, log) = spawn_logged(host.env(run, env));
        let mut seen = String::new();
        wait_for(&log, &mut seen, &["fleetd ready"], Duration::from_secs(20));
        host.daemon = Some(child);
        host._log = log;
        host
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn env(&self, mut command: Command, env: &[(&str, &str)]) -> Command {
        command
            .env_remove("FLEETD_CONFIG")
            .env("HOME", self.path())
            .env("XDG_CONFIG_HOME", self.path().join("config"))
            .env("XDG_STATE_HOME", self.path().join("state"))
            .env("XDG_RUNTIME_DIR", self.path().join("run"))
            // A directory of its own: every agent's sandbox hides it (not the roots beside it).
            .env("TMUX_TMPDIR", self.path().join("tmux"));
        for (name, value) in env {
            command.env(name, value);
        }
        command
    }

    fn fleetd(&self, args: &[&str]) -> Value {
        let mut command = Command::new(BIN);
        command.args(args).arg("--json");
        let out = self.env(command, &[]).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "fleetd {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    fn drops(&self) -> usize {
        std::fs::read_to_string(self.path().join("work/drops"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// Spawns the stand-in and opens a primary mailbox: their ids.
    fn spawn_tui(&self) -> (String, String) {
        let started = self.fleetd(&["spawn", "--profile", "tui", "--label", "t1"]);
        assert_eq!(started["outcome"], "started", "{started}");
        let agent = started["agent"].as_str().unwrap().to_owned();
        let primary = self.fleetd(&["agent", "open", "primary"])["id"]
            .as_str()
            .unwrap()
            .to_owned();
        (agent, primary)
    }

    /// Starts the agents' tmux server (as the operator's unit would).
    fn tmux_server(&self) {
        let mut tmux = Command::new("tmux");
        tmux.args([
            "-L",
            "fleetd",
            "new-session",
            "-d",
            "-s",
            "keep",
            "sleep 600",
        ]);
        assert!(self.env(tmux, &[]).status().unwrap().success());
    }

    /// The pane of the one agent fleetd launched (in its session, `fleetd`).
    fn agent_pane(&self) -> String {
        let panes = self.tmux(&["list-panes", "-a", "-F", "#{pane_id} #{session_name}"]);
        panes
            .lines()
            .find(|l| l.ends_with(" fleetd"))
            .and_then(|l| l.split(' ').next())
            .unwrap()
            .to_owned()
    }

    fn tmux(&self, args: &[&str]) -> String {
        let mut command = Command::new("tmux");
        command.args(["-L", "fleetd"]).args(args);
        let out = self.env(command, &[]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(daemon) = &mut self.daemon {
            common::terminate(daemon);
            let _ = daemon.wait();
        }
        let _ = self.tmux(&["kill-server"]);
    }
}

/// Message `id` (text `text`) was taken by the stand-in exactly once, as a turn of its own.
fn taken_once(shown: &str, id: &str, text: &str) {
    let turns: Vec<&str> = shown
        .lines()
        .filter(|l| l.starts_with("you said: ") && l.contains(&format!("msg {id}]")))
        .collect();
    assert_eq!(turns.len(), 1, "message {id} taken once:\n{shown}");
    assert!(
        turns[0].ends_with(&format!("] {text}")) && turns[0].matches("[fleetd:").count() == 1,
        "a turn of its own:\n{shown}"
    );
}

/// Spawns the TUI, sends three messages at once and checks each was taken as its own turn;
/// `screen` reads the agent's pane.
fn three_messages_three_turns(host: &Host, screen: &dyn Fn(&str) -> String) {
    let (agent, primary) = host.spawn_tui();
    let ids: Vec<String> = ["one", "two", "three"]
        .iter()
        .map(|text| {
            host.fleetd(&["send", &agent, text, "--from", &primary])["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    for id in &ids {
        eventually(
            &format!("message {id} delivered"),
            Duration::from_secs(30),
            || (host.fleetd(&["delivery", id])["state"] == "delivered").then_some(()),
        );
    }
    assert_eq!(host.drops(), 1, "the stand-in dropped the first Enter");
    let shown = screen(&agent);
    for (id, text) in ids.iter().zip(["one", "two", "three"]) {
        taken_once(&shown, id, text);
    }
    let input = shown.lines().rfind(|l| l.starts_with('>')).unwrap_or("");
    assert!(
        !input.contains("[fleetd:"),
        "the input line is empty:\n{shown}"
    );
}

#[test]
fn over_tmux_a_dropped_enter_is_pressed_again_and_each_message_is_its_own_turn() {
    let host = Host::start("", &[]);
    host.tmux_server();
    three_messages_three_turns(&host, &|_| {
        let pane = host.agent_pane();
        host.tmux(&["capture-pane", "-p", "-J", "-t", &pane, "-S", "-100"])
    });
}

#[test]
fn a_message_the_agent_does_not_take_stays_held_with_why_and_nothing_is_glued_to_it() {
    let host = Host::start_in_mode("", &[], "deaf");
    host.tmux_server();
    let (agent, primary) = host.spawn_tui();
    let send = |text: &str| {
        host.fleetd(&["send", &agent, text, "--from", &primary])["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let first = send("first");
    let second = send("second");
    // Enter pressed, and once more; the agent took neither: held, with why, in the roster.
    let entry = eventually("the agent blocked", Duration::from_secs(20), || {
        let roster = host.fleetd(&["roster"]);
        let entry = roster["hosts"][0]["agents"]
            .as_array()?
            .iter()
            .find(|a| a["id"] == agent.as_str())?
            .clone();
        (entry["status"] == "blocked").then_some(entry)
    });
    let why = entry["why"].as_str().unwrap_or_default();
    assert!(
        why.contains(&first) && why.contains("still on its input line"),
        "{entry}"
    );
    assert_eq!(host.drops(), 2, "Enter pressed twice, both dropped");
    for id in [&first, &second] {
        assert_eq!(host.fleetd(&["delivery", id])["state"], "queued");
    }
    let pane = host.agent_pane();
    std::thread::sleep(Duration::from_secs(2));
    let shown = host.tmux(&["capture-pane", "-p", "-J", "-t", &pane]);
    assert!(
        !shown.contains(&format!("msg {second}]")),
        "nothing typed behind the first message:\n{shown}"
    );
    assert_eq!(
        host.drops(),
        2,
        "no further Enter pressed on its own:\n{shown}"
    );
    // The agent hears again and someone at its terminal presses Enter: the first message is
    // taken (delivered), then the second is typed and taken, each its own turn.
    std::fs::write(host.path().join("work/drops.hear"), "").unwrap();
    host.tmux(&["send-keys", "-t", &pane, "Enter"]);
    for id in [&first, &second] {
        eventually(
            &format!("message {id} delivered"),
            Duration::from_secs(20),
            || (host.fleetd(&["delivery", id])["state"] == "delivered").then_some(()),
        );
    }
    let shown = host.tmux(&["capture-pane", "-p", "-J", "-t", &pane, "-S", "-100"]);
    for (id, text) in [(&first, "first"), (&second, "second")] {
        taken_once(&shown, id, text);
    }
}

#[test]
fn an_agent_that_does_not_take_its_message_is_in_no_other_agents_way() {
    let host = Host::start_in_mode("", &[], "deaf");
    host.tmux_server();
    let (deaf, primary) = host.spawn_tui();
    let started = host.fleetd(&["spawn", "--profile", "line", "--label", "l1"]);
    assert_eq!(started["outcome"], "started", "{started}");
    let other = started["agent"].as_str().unwrap().to_owned();
    let send = |to: &str, text: &str| {
        host.fleetd(&["send", to, text, "--from", &primary])["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let first = send(&deaf, "first");
    // The deaf agent's first Enter was pressed and dropped: its injector now waits 1.5 s for
    // the agent to take the message before pressing Enter again.
    eventually("the first Enter dropped", Duration::from_secs(20), || {
        (host.drops() >= 1).then_some(())
    });
    let to_other = send(&other, "for the other agent");
    eventually(
        "the other agent's message delivered",
        Duration::from_secs(20),
        || (host.fleetd(&["delivery", &to_other])["state"] == "delivered").then_some(()),
    );
    // Delivered while the deaf agent's message was still waiting for its second Enter: no
    // worker waits for another agent's pane.
    assert_eq!(
        host.drops(),
        1,
        "the other agent's message waited behind the deaf agent's"
    );
    assert_eq!(host.fleetd(&["delivery", &first])["state"], "queued");
    let panes = host.tmux(&["list-panes", "-a", "-F", "#{pane_id}"]);
    let shown: String = panes
        .lines()
        .map(|p| host.tmux(&["capture-pane", "-p", "-J", "-t", p]))
        .collect();
    let read = shown
        .lines()
        .filter(|l| {
            l.starts_with("got:") && l.ends_with(&format!("msg {to_other}] for the other agent"))
        })
        .count();
    assert_eq!(read, 1, "read once by the other agent:\n{shown}");
}

/// The tests that need a real herdr (`scripts/test` skips `herdr::` where there is none).
mod herdr {
    use super::*;
    use crate::common::herdr::HerdrServer;

    #[test]
    fn over_herdr_a_dropped_enter_is_pressed_again_and_each_message_is_its_own_turn() {
        let server = HerdrServer::start();
        let (config, socket) = server.daemon_env();
        let host = Host::start(&config, &[("HERDR_SOCKET_PATH", &socket)]);
        three_messages_three_turns(&host, &|_| {
            let workspaces = server.call("workspace.list", serde_json::json!({}));
            let ours = workspaces["workspaces"]
                .as_array()
                .unwrap()
                .iter()
                .find(|w| w["label"] == "fleetd")
                .cloned()
                .unwrap();
            let listed = server.call(
                "pane.list",
                serde_json::json!({"workspace_id": ours["workspace_id"]}),
            );
            let pane = listed["panes"][0]["pane_id"].as_str().unwrap().to_owned();
            server.text(&pane)
        });
    }
}

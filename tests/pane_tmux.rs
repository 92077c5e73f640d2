//! The tmux backend against a real, private tmux server (`tmux -L <unique name>`), started here
//! the way the operator's unit starts it — never by fleetd.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code fails loudly"
)]

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::fake_tmux::FakeTmux;
use fleetd::pane::tmux::{Socket, Tmux};
use fleetd::pane::{Launch, Multiplexer, PaneError, PaneId, PaneState};

/// A private tmux server, killed when dropped.
struct Server(String);

impl Server {
    fn start() -> Server {
        let name = format!(
            "fleetd-test-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos() ^ u128::from(rand_u32())
        );
        let started = Command::new("tmux")
            .args(["-L", &name, "new-session", "-d", "-s", "keep", "sleep 600"])
            .status()
            .expect("tmux is needed for the pane tests (package tmux)");
        assert!(started.success(), "cannot start a tmux server");
        Server(name)
    }

    fn tmux(&self) -> Tmux {
        Tmux::new(Socket::Name(self.0.clone()), "fleetd")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.0, "kill-server"])
            .status();
    }
}

fn rand_u32() -> u32 {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).unwrap();
    u32::from_le_bytes(bytes)
}

fn launch(argv: &[&str], env: &[(&str, &str)]) -> Launch {
    Launch {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        cwd: std::env::temp_dir(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        init: None,
        sandbox: None,
    }
}

/// Waits until the pane shows `needle`; returns what it shows.
fn wait_shown(tmux: &Tmux, pane: &PaneId, needle: &str) -> String {
    let start = Instant::now();
    loop {
        let shown = tmux.read(pane, 50).unwrap();
        if shown.contains(needle) {
            return shown;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "pane never showed {needle:?}; it shows:\n{shown}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn every_command_line() -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(bytes) = std::fs::read(entry.path().join("cmdline")) {
            all.push_str(&String::from_utf8_lossy(&bytes));
            all.push('\n');
        }
    }
    all
}

#[test]
fn a_pane_gets_its_environment_off_every_command_line_and_typed_text_neutralised() {
    let server = Server::start();
    let tmux = server.tmux();
    let canary = format!("canary-{:08x}{:08x}", rand_u32(), rand_u32());
    let pane = tmux
        .launch(&launch(
            &[
                "sh",
                "-c",
                "echo ready:$TOKEN; while read -r line; do echo \"got:[$line]\"; done",
            ],
            &[("TOKEN", &canary), ("QUOTED", "it's $HOME; #{x}")],
        ))
        .unwrap();
    assert!(pane.0.starts_with('%'), "{pane}");
    wait_shown(&tmux, &pane, &format!("ready:{canary}"));
    assert!(
        !every_command_line().contains(&canary),
        "the environment value appeared on a command line"
    );
    assert!(tmux.list().unwrap().contains(&pane));

    // Escape sequences, a bracketed-paste terminator, NUL and a lone CR are taken out before
    // anything is typed; the text arrives once, as one line.
    tmux.send_text(
        &pane,
        "hello \u{1b}[31mred\u{1b}[0m \u{1b}[201~; echo pwned\0 \rworld",
    )
    .unwrap();
    let shown = wait_shown(&tmux, &pane, "got:[hello red ; echo pwned world]");
    assert_eq!(
        shown.matches("got:[").count(),
        1,
        "typed exactly once:\n{shown}"
    );
    assert!(!shown.contains("\u{1b}"), "{shown}");
    assert_eq!(tmux.state(&pane).unwrap(), PaneState::Running);

    tmux.close(&pane).unwrap();
    assert!(!tmux.list().unwrap().contains(&pane));
    assert!(matches!(tmux.state(&pane), Err(PaneError::NoPane(_))));
}

#[test]
fn an_exited_process_leaves_its_status_and_bad_requests_are_refused() {
    let server = Server::start();
    let tmux = server.tmux();
    let pane = tmux.launch(&launch(&["sh", "-c", "exit 3"], &[])).unwrap();
    let start = Instant::now();
    loop {
        match tmux.state(&pane).unwrap() {
            PaneState::Exited(status) if status != -1 => {
                assert_eq!(status, 3);
                break;
            }
            // Dead, its status not yet known (tmux reaps it a moment later under load).
            PaneState::Exited(_) | PaneState::Running => {
                assert!(start.elapsed() < Duration::from_secs(10), "never exited");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    assert!(matches!(
        tmux.launch(&launch(&[], &[])),
        Err(PaneError::Refused(_))
    ));
    assert!(matches!(
        tmux.launch(&launch(&["sh"], &[("A", "two\nlines")])),
        Err(PaneError::Refused(_))
    ));
    assert!(matches!(
        tmux.send_text(&PaneId("%1;kill-server".to_owned()), "x"),
        Err(PaneError::NoPane(_))
    ));
    assert!(tmux.list().is_ok(), "the server is still there");
}

#[test]
fn fleetd_never_starts_the_tmux_server_itself() {
    let tmux = Tmux::new(
        Socket::Name(format!("fleetd-test-absent-{}", rand_u32())),
        "fleetd",
    );
    let error = tmux.launch(&launch(&["true"], &[])).unwrap_err();
    assert!(error.to_string().contains("no tmux server runs"), "{error}");
}

/// The environment of the process running in `pane`, read from /proc.
fn pane_environ(server: &Server, pane: &PaneId) -> String {
    let out = Command::new("tmux")
        .args([
            "-L",
            &server.0,
            "display-message",
            "-p",
            "-t",
            &pane.0,
            "#{pane_pid}",
        ])
        .output()
        .unwrap();
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let bytes = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    String::from_utf8_lossy(&bytes).replace('\0', "\n")
}

fn tmux_out(server: &Server, args: &[&str]) -> String {
    let out = Command::new("tmux")
        .arg("-L")
        .arg(&server.0)
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn one_panes_environment_never_reaches_the_next_pane_the_session_or_the_server() {
    let server = Server::start();
    let tmux = server.tmux();
    let canary = format!("canary-{:08x}{:08x}", rand_u32(), rand_u32());
    // The first launch creates the `fleetd` session; the second opens a window in it.
    let first = tmux
        .launch(&launch(&["sleep", "600"], &[("ALPHA_TOKEN", &canary)]))
        .unwrap();
    let second = tmux.launch(&launch(&["sleep", "600"], &[])).unwrap();
    assert!(
        pane_environ(&server, &first).contains(&format!("ALPHA_TOKEN={canary}")),
        "the first pane has its own variable"
    );
    assert!(
        !pane_environ(&server, &second).contains("ALPHA_TOKEN"),
        "the second pane inherited the first one's variable"
    );
    let global = tmux_out(&server, &["show-environment", "-g"]);
    assert!(
        !global.contains("ALPHA_TOKEN"),
        "global environment: {global}"
    );
    for session in tmux_out(&server, &["list-sessions", "-F", "#{session_name}"]).lines() {
        let env = tmux_out(&server, &["show-environment", "-t", session]);
        assert!(!env.contains("ALPHA_TOKEN"), "session {session}: {env}");
    }
    // No server-wide option was changed for the user's other windows; the placeholder window
    // that created the session is gone: the session holds the two agents' windows only.
    assert_eq!(
        tmux_out(&server, &["show-options", "-g", "-w", "remain-on-exit"]).trim(),
        "remain-on-exit off"
    );
    assert_eq!(
        tmux_out(
            &server,
            &["show-options", "-w", "-t", "keep:", "remain-on-exit"]
        )
        .trim(),
        "",
        "the user's own window got no option"
    );
    let panes = tmux_out(
        &server,
        &["list-panes", "-s", "-t", "fleetd", "-F", "#{pane_id}"],
    );
    let mut panes: Vec<&str> = panes.lines().collect();
    panes.sort_unstable();
    let mut agents = [first.0.as_str(), second.0.as_str()];
    agents.sort_unstable();
    assert_eq!(
        panes, agents,
        "the fleetd session holds exactly the agents' panes"
    );
}

#[test]
fn typing_into_a_pane_whose_process_exited_is_refused_and_the_server_survives() {
    let server = Server::start();
    let tmux = server.tmux();
    let pane = tmux.launch(&launch(&["sh", "-c", "exit 0"], &[])).unwrap();
    let start = Instant::now();
    while tmux.state(&pane).unwrap() == PaneState::Running {
        assert!(start.elapsed() < Duration::from_secs(10), "never exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    // tmux 3.3a crashes (SIGSEGV, every session gone) when it pastes into such a pane.
    let typed = tmux.send_text(&pane, "hello");
    assert!(
        matches!(&typed, Err(PaneError::Refused(why)) if why.contains("has exited")),
        "{typed:?}"
    );
    assert!(
        tmux.list().unwrap().contains(&pane),
        "the server is still there"
    );
    let buffers = tmux_out(&server, &["list-buffers"]);
    assert!(
        !buffers.contains("fleetd-"),
        "no buffer left behind: {buffers}"
    );
}

/// A hook on the real server that makes the client of the command that fires it read a file
/// into a buffer and write a buffer into a file: with the `tmux` binary as the client, the
/// client opens both paths (tmux 3.3a `file.c`); with fleetd's client, neither is opened, the
/// server gets `EACCES`, and both requests are reported as alarms.
#[test]
fn a_servers_hooks_cannot_make_fleetds_client_read_or_write_a_file() {
    let server = Server::start();
    let tmux = server.tmux();
    let dir = tempfile::tempdir().unwrap();
    let canary = format!("canary-{:08x}{:08x}", rand_u32(), rand_u32());
    let secret = dir.path().join("host-key");
    std::fs::write(&secret, &canary).unwrap();
    let planted = dir.path().join("planted");
    let hooks = [
        format!("load-buffer -b stolen {}", secret.display()),
        format!("save-buffer -b bait {}", planted.display()),
    ];
    tmux_out(&server, &["set-buffer", "-b", "bait", "written by a hook"]);
    tmux_out(&server, &["set-hook", "-g", "after-list-panes", &hooks[0]]);
    tmux_out(
        &server,
        &["set-hook", "-g", "after-capture-pane", &hooks[1]],
    );

    // The hooks work: the `tmux` binary, as client, reads and writes for the server.
    tmux_out(&server, &["list-panes", "-a"]);
    assert_eq!(tmux_out(&server, &["show-buffer", "-b", "stolen"]), canary);
    tmux_out(&server, &["capture-pane", "-p", "-t", "keep"]);
    assert!(planted.exists(), "the hook's save-buffer did not run");
    std::fs::remove_file(&planted).unwrap();
    tmux_out(&server, &["delete-buffer", "-b", "stolen"]);

    // fleetd's client: nothing is read or written. The hook's command fails on the EACCES it
    // got, and tmux fails the command that fired it: the server may refuse to serve fleetd (it
    // is the agents'), but it cannot make fleetd read or write for it.
    let hook_failed = |result: Result<String, PaneError>| match result {
        Err(PaneError::Unavailable { detail, .. }) => assert!(
            detail.contains("Permission denied"),
            "not the hook's refused open: {detail}"
        ),
        other => panic!("the hook's failure should fail the call: {other:?}"),
    };
    hook_failed(tmux.list().map(|_| String::new()));
    hook_failed(tmux.read(&PaneId("%0".to_owned()), 10));
    assert_eq!(tmux_out(&server, &["show-buffer", "-b", "stolen"]), "");
    assert!(
        !planted.exists(),
        "fleetd's client wrote a file for the server"
    );
    let buffers = tmux_out(&server, &["list-buffers", "-F", "#{buffer_sample}"]);
    assert!(!buffers.contains(&canary), "{buffers}");
    let alarms = tmux.alarms();
    assert_eq!(alarms.len(), 2, "{alarms:?}");
    assert!(
        alarms[0].contains(&format!("open `{}` for reading", secret.display())),
        "{alarms:?}"
    );
    assert!(
        alarms[1].contains(&format!("open `{}` for writing", planted.display())),
        "{alarms:?}"
    );
    assert!(tmux.alarms().is_empty(), "alarms are taken once");
}

/// A stand-in server in place of the real socket (`tests/common/fake_tmux.rs`, a test double:
/// a real server never asks a command client to exec a shell) asks fleetd's client to open a
/// path for reading, one for writing, then to exec a shell.
#[test]
fn a_fake_server_asking_to_open_files_or_exec_a_shell_is_refused_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("tmux");
    let secret = dir.path().join("credential");
    std::fs::write(&secret, "canary-credential").unwrap();
    let planted = dir.path().join("planted");
    let shell = dir.path().join("evil.sh");
    let ran = dir.path().join("ran");
    std::fs::write(&shell, format!("#!/bin/sh\ntouch {}\n", ran.display())).unwrap();
    std::fs::set_permissions(&shell, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let fake = FakeTmux::serve(&socket, &secret, &planted, &shell);
    let tmux = Tmux::new(Socket::Path(socket), "fleetd");
    let error = tmux.list().unwrap_err();
    assert!(
        matches!(&error, PaneError::Refused(why) if why.contains("exec a shell")),
        "{error}"
    );
    // Both opens answered EACCES for their streams, before anything was touched.
    let answers = fake.wait_answers(1);
    assert_eq!(answers.len(), 1);
    assert!(FakeTmux::refused_both(&answers[0]), "{answers:?}");
    assert!(!planted.exists() && !ran.exists());
    let alarms = tmux.alarms();
    assert_eq!(alarms.len(), 3, "{alarms:?}");
    assert!(alarms[0].contains(&format!("`{}` for reading", secret.display())));
    assert!(alarms[1].contains(&format!("`{}` for writing", planted.display())));
    assert!(alarms[2].contains("exec a shell (MSG_SHELL)"), "{alarms:?}");
}

/// A hook that prints another pane's id — even behind the new window's name — after the
/// window fleetd opens: fleetd takes the id tmux printed for the new window, never the hook's.
#[test]
fn a_hook_printing_another_panes_id_does_not_redirect_a_launch() {
    let server = Server::start();
    let tmux = server.tmux();
    let keep = tmux_out(&server, &["list-panes", "-a", "-F", "#{pane_id}"]);
    let keep = keep.lines().next().unwrap().to_owned();
    let hooks = [
        format!("display-message -p '{keep}'"),
        format!("display-message -p '#{{window_name}} {keep}'"),
    ];
    tmux_out(
        &server,
        &["set-hook", "-g", "after-new-window[0]", &hooks[0]],
    );
    tmux_out(
        &server,
        &["set-hook", "-g", "after-new-window[1]", &hooks[1]],
    );
    let pane = tmux
        .launch(&launch(
            &["/bin/sh", "-c", "echo launched-here; sleep 30"],
            &[],
        ))
        .unwrap();
    assert_ne!(pane.0, keep, "the hook's id was taken");
    wait_shown(&tmux, &pane, "launched-here");
}

//! The herdr backend against the **real herdr** (0.8.2, protocol 20): a private headless server
//! per test (`common::herdr`). Only the refusal of an unknown protocol uses a stand-in server —
//! a real herdr cannot be made to speak another protocol — and it says so.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::herdr::{HerdrServer, fake_claude};
use fleetd::pane::herdr::Herdr;
use fleetd::pane::{Launch, Multiplexer, PaneId, PaneState};
use serde_json::json;

fn launch(argv: &[&str], env: &[(&str, &str)], cwd: &Path) -> Launch {
    Launch {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        cwd: cwd.to_owned(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        init: None,
        sandbox: None,
    }
}

fn eventually<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The fake `claude` of [`fake_claude`] in `dir/bin`, saying where it runs from.
fn claude_in(dir: &Path) -> String {
    fake_claude(&dir.join("bin"), "printf 'fake claude at %s\\n' \"$0\"")
}

/// The pid of the process in `pane`'s foreground that is not its shell.
fn foreground_pid(server: &HerdrServer, pane: &PaneId) -> u64 {
    eventually(
        "a foreground process in the pane",
        Duration::from_secs(10),
        || server.foreground_pid(&pane.0),
    )
}

fn kill(pid: u64) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {pid}");
}

fn exited(herdr: &Herdr, pane: &PaneId, within: Duration) -> i32 {
    eventually("the pane's process exited", within, || {
        match herdr.state(pane).unwrap() {
            PaneState::Exited(status) => Some(status),
            PaneState::Running => None,
        }
    })
}

/// (workspace label, pane id, focused) of every pane.
fn panes(server: &HerdrServer) -> Vec<(String, String, bool)> {
    let workspaces = server.call("workspace.list", json!({}));
    let label = |id: &str| {
        workspaces["workspaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["workspace_id"] == id)
            .map(|w| w["label"].as_str().unwrap().to_owned())
            .unwrap()
    };
    server.call("pane.list", json!({}))["panes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                label(p["workspace_id"].as_str().unwrap()),
                p["pane_id"].as_str().unwrap().to_owned(),
                p["focused"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// The tests that need a real herdr (`scripts/test` skips `herdr::` where there is none, outside
/// CI, and says so).
mod herdr {
    use super::*;

    #[test]
    fn on_a_fresh_server_fleetd_opens_its_own_workspace_and_never_resizes_or_focuses_the_users_panes()
     {
        let server = HerdrServer::start();
        let dir = tempfile::tempdir().unwrap();
        let herdr = Herdr::open(&server.socket()).unwrap();

        // No workspace yet: a split would have no target (herdr answers pane_not_found).
        let first = herdr
            .launch(&launch(
                &["/bin/sh", "-c", "echo up; sleep 600"],
                &[],
                dir.path(),
            ))
            .unwrap();
        eventually("the command runs", Duration::from_secs(10), || {
            server.text(&first.0).contains("up").then_some(())
        });
        assert_eq!(herdr.state(&first).unwrap(), PaneState::Running);

        // The user's own workspace, focused, with two panes side by side.
        let mine = server.call(
            "workspace.create",
            json!({"label": "mine", "cwd": dir.path(), "focus": true}),
        );
        let left = mine["root_pane"]["pane_id"].as_str().unwrap().to_owned();
        let right = server.call(
            "pane.split",
            json!({"target_pane_id": left, "direction": "right", "focus": false}),
        )["pane"]["pane_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let before = (server.rect(&left), server.rect(&right));
        let focused_before: Vec<_> = panes(&server).into_iter().filter(|p| p.2).collect();
        assert_eq!(focused_before.len(), 1, "{focused_before:?}");

        let mut ours = vec![first];
        for n in 0..3 {
            ours.push(
                herdr
                    .launch(&launch(
                        &["/bin/sh", "-c", &format!("echo pane-{n}; sleep 600")],
                        &[],
                        dir.path(),
                    ))
                    .unwrap(),
            );
        }
        assert_eq!(
            (server.rect(&left), server.rect(&right)),
            before,
            "the user's panes keep their size"
        );
        let focused_after: Vec<_> = panes(&server).into_iter().filter(|p| p.2).collect();
        assert_eq!(focused_after, focused_before, "focus stays where it was");
        let all = panes(&server);
        for pane in &ours {
            let (label, _, _) = all.iter().find(|p| p.1 == pane.0).unwrap();
            assert_eq!(label, "fleetd", "{pane} is in fleetd's workspace: {all:?}");
        }
        // One tab each: nothing of fleetd's was split either.
        let tabs: std::collections::HashSet<String> = server.call("pane.list", json!({}))["panes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| ours.iter().any(|o| p["pane_id"] == o.0.as_str()))
            .map(|p| p["tab_id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(tabs.len(), ours.len(), "a tab per pane");
        for pane in &ours {
            herdr.close(pane).unwrap();
        }
    }

    #[test]
    fn an_agent_starts_from_the_profiles_absolute_path_not_from_path() {
        let server = HerdrServer::start();
        let dir = tempfile::tempdir().unwrap();
        let ours = claude_in(dir.path());
        // A decoy `claude` first on the pane's PATH: herdr would run it by name.
        let decoy = dir.path().join("decoy");
        std::fs::create_dir_all(&decoy).unwrap();
        std::fs::write(decoy.join("claude"), "#!/bin/sh\necho DECOY; sleep 600\n").unwrap();
        std::fs::set_permissions(decoy.join("claude"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let path = format!("{}:/usr/bin:/bin", decoy.display());
        let herdr = Herdr::open(&server.socket()).unwrap();
        let pane = herdr
            .launch(&launch(
                &[&ours, "--model", "x"],
                &[("PATH", &path)],
                dir.path(),
            ))
            .unwrap();
        eventually(
            "herdr says the agent is ready",
            Duration::from_secs(20),
            || herdr.ready(&pane).unwrap().unwrap().then_some(()),
        );
        let shown = server.text(&pane.0);
        assert!(shown.contains(&format!("fake claude at {ours}")), "{shown}");
        assert!(!shown.contains("DECOY"), "{shown}");
        herdr.close(&pane).unwrap();
    }

    /// A policy with a scripted agent (ready by its pattern), an agent herdr starts (ready by
    /// herdr; unsandboxed), the same agent sandboxed (a command to herdr, ready by its pattern)
    /// and a command that exits with status 3 before it is ready.
    fn policy(dir: &Path, claude: &str) -> fleetd::policy::PolicySet {
        let policy_dir = dir.join("policy");
        std::fs::create_dir_all(&policy_dir).unwrap();
        std::fs::write(
            policy_dir.join("p.toml"),
            format!(
                r#"[profile.scripted]
    description = "A scripted agent: ready when it says so."
    argv = ["/bin/sh", "-c", '''sleep 0.3; echo 'worker> ready'; while IFS= read -r l; do echo "got: $l"; done''']
    roots = ["{root}"]
    max_instances = 2
    [profile.scripted.ready]
    pattern = "^worker> ready"
    timeout_secs = 15

    [profile.claude]
    description = "An agent herdr knows (a fake claude)."
    argv = ["{claude}"]
    roots = ["{root}"]
    max_instances = 2
    [profile.claude.ready]
    timeout_secs = 30
    # herdr starts it as its own agent (agent.start) only unsandboxed.
    [profile.claude.sandbox]
    mode = "off"

    [profile.boxed-claude]
    description = "The agent herdr knows, in its sandbox: fleetd runs it as a command."
    argv = ["{claude}"]
    roots = ["{root}"]
    max_instances = 1
    [profile.boxed-claude.ready]
    pattern = "^fake claude at"
    timeout_secs = 30

    [profile.crashing]
    description = "Exits with status 3 before it is ready."
    argv = ["/bin/sh", "-c", "echo starting; exit 3"]
    roots = ["{root}"]
    max_instances = 1
    [profile.crashing.ready]
    pattern = "^never"
    timeout_secs = 15

    [[grant]]
    id = "g"
    description = "test"
    fleets = ["f"]
    hosts = ["h"]
    profiles = ["scripted", "claude", "boxed-claude", "crashing"]
    "#,
                root = dir.display()
            ),
        )
        .unwrap();
        let (policy, diagnostics) = fleetd::policy::load_dir(&policy_dir);
        policy.unwrap_or_else(|_| panic!("{diagnostics:?}"))
    }

    fn spawn(
        spawner: &fleetd::spawn::Spawner,
        policy: &fleetd::policy::PolicySet,
        profile: &str,
    ) -> fleetd::spawn::Outcome {
        let request = fleetd::policy::Request::from_value(
            &json!({"origin": {"fleet": "f", "host": "h"}, "profile": profile}),
        )
        .unwrap();
        spawner.spawn(policy, &request, &|_| Err("no secrets here".into()), &[])
    }

    fn started(outcome: fleetd::spawn::Outcome) -> PaneId {
        match outcome {
            fleetd::spawn::Outcome::Started { pane, .. } => pane,
            other => panic!("not started: {other:?}"),
        }
    }

    #[test]
    fn a_scripted_agent_and_an_agent_herdr_starts_become_ready_and_each_message_is_typed_once() {
        let server = HerdrServer::start();
        let dir = tempfile::tempdir().unwrap();
        let policy = policy(dir.path(), &claude_in(dir.path()));
        let herdr = Arc::new(Herdr::open(&server.socket()).unwrap());
        // The scripted agent and the crashing command run in their sandboxes, behind the init.
        let spawner = fleetd::spawn::Spawner::new(Arc::clone(&herdr) as Arc<dyn Multiplexer>)
            .with_init(env!("CARGO_BIN_EXE_fleetd").into());

        let scripted = started(spawn(&spawner, &policy, "scripted"));
        let agent = started(spawn(&spawner, &policy, "claude"));
        assert_eq!(herdr.ready(&agent).map(Result::unwrap), Some(true));
        assert_eq!(herdr.blocked(&agent), Some(false));
        assert!(
            herdr.ready(&scripted).is_none(),
            "a script is not herdr's agent"
        );
        // The agent herdr knows, sandboxed: run as a command in its sandbox, not by herdr.
        let boxed = match spawn(&spawner, &policy, "boxed-claude") {
            fleetd::spawn::Outcome::Started {
                pane,
                process: Some(process),
                ..
            } => {
                // The fake claude, found below the pane's process: in a PID namespace of its own.
                let claude = eventually("the agent's process", Duration::from_secs(10), || {
                    let mut below = vec![process.pid()];
                    while let Some(pid) = below.pop() {
                        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"));
                        if comm.is_ok_and(|c| c.trim() == "claude") {
                            return Some(pid);
                        }
                        below.extend(fleetd::pane::process::children(pid));
                    }
                    None
                });
                let status = std::fs::read_to_string(format!("/proc/{claude}/status")).unwrap();
                let nspid = status
                    .lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .unwrap();
                assert_eq!(
                    nspid.split_whitespace().count(),
                    2,
                    "the sandboxed agent is in a PID namespace of its own: {nspid}"
                );
                pane
            }
            other => panic!("the sandboxed herdr agent did not start: {other:?}"),
        };
        assert!(
            herdr.ready(&boxed).is_none(),
            "a sandboxed agent is not herdr's: herdr would start it outside the sandbox"
        );

        for pane in [&scripted, &agent, &boxed] {
            herdr
                .send_text(pane, "hello \u{1b}[201~\u{1b}[31mthere\0")
                .unwrap();
            let line = eventually("the reply", Duration::from_secs(10), || {
                let shown = herdr.read(pane, 30).unwrap();
                shown.contains("got: hello there").then_some(shown)
            });
            std::thread::sleep(Duration::from_millis(500));
            let shown = server.text(&pane.0);
            assert_eq!(
                shown.matches("got: hello").count(),
                1,
                "typed exactly once, escapes removed: {line}\n{shown}"
            );
        }

        // A command that exits before it is ready fails the spawn with its status — also when
        // herdr has dropped its pane before fleetd could ask for the pane's process (a race
        // CI once lost: "cannot learn the pane's process: no pane"), so it is tried 10 times.
        for _ in 0..10 {
            match spawn(&spawner, &policy, "crashing") {
                fleetd::spawn::Outcome::Failed { reason } => {
                    assert!(reason.contains("status 3"), "{reason}");
                }
                other => panic!("the crashing command was not reported: {other:?}"),
            }
        }
    }

    /// What a sandboxed agent tries against the live herdr server it runs under.
    const PROBER: &str = r#"
import errno, socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    print("herdr socket: connected")
except OSError as e:
    print("herdr socket:", errno.errorcode.get(e.errno, e.errno))
print("prober> ready", flush=True)
sys.stdin.read()
"#;

    #[test]
    fn a_sandboxed_agent_cannot_reach_the_herdr_server_it_runs_under() {
        let server = HerdrServer::start();
        let dir = tempfile::tempdir().unwrap();
        let socket = server.socket();
        // The socket is there and answers from outside the sandbox.
        std::os::unix::net::UnixStream::connect(&socket).unwrap();
        let policy_dir = dir.path().join("policy");
        std::fs::create_dir_all(&policy_dir).unwrap();
        std::fs::write(
            policy_dir.join("p.toml"),
            format!(
                r#"[profile.prober]
    description = "Tries herdr's socket from its sandbox."
    argv = ["/usr/bin/python3", "-I", "-c", '''{PROBER}''', "{socket}"]
    roots = ["{root}"]
    max_instances = 1
    [profile.prober.ready]
    pattern = "^prober> ready"
    timeout_secs = 15

    [[grant]]
    id = "g"
    description = "test"
    fleets = ["f"]
    hosts = ["h"]
    profiles = ["prober"]
    "#,
                socket = socket.display(),
                root = dir.path().display()
            ),
        )
        .unwrap();
        let (policy, diagnostics) = fleetd::policy::load_dir(&policy_dir);
        let policy = policy.unwrap_or_else(|_| panic!("{diagnostics:?}"));
        let herdr = Arc::new(Herdr::open(&socket).unwrap());
        // As the daemon does: herdr's socket directory among the places every sandbox hides.
        let places =
            fleetd::spawn::HostPlaces::new(vec![socket.parent().unwrap().to_path_buf()], None);
        let spawner = fleetd::spawn::Spawner::new(Arc::clone(&herdr) as Arc<dyn Multiplexer>)
            .with_init(env!("CARGO_BIN_EXE_fleetd").into())
            .with_places(places);
        let pane = started(spawn(&spawner, &policy, "prober"));
        let shown = herdr.read(&pane, 30).unwrap();
        assert!(
            shown.contains("herdr socket: ENOENT"),
            "the herdr socket is absent inside the sandbox: {shown}"
        );
        herdr.close(&pane).unwrap();
    }

    #[test]
    fn deaths_are_noticed_with_their_status_and_later_panes_still_report_theirs() {
        let server = HerdrServer::start();
        let dir = tempfile::tempdir().unwrap();
        let claude = claude_in(dir.path());
        let herdr = Herdr::open(&server.socket()).unwrap();

        let agent = herdr.launch(&launch(&[&claude], &[], dir.path())).unwrap();
        eventually("ready", Duration::from_secs(20), || {
            herdr.ready(&agent).unwrap().unwrap().then_some(())
        });
        let command = herdr
            .launch(&launch(
                &["/bin/sh", "-c", "echo up; exec sleep 600"],
                &[],
                dir.path(),
            ))
            .unwrap();
        eventually("the command runs", Duration::from_secs(10), || {
            herdr
                .read(&command, 5)
                .unwrap()
                .contains("up")
                .then_some(())
        });

        // Killed from outside: the agent (herdr gives no status) and the command (status 137).
        kill(foreground_pid(&server, &agent));
        assert_eq!(exited(&herdr, &agent, Duration::from_secs(5)), -1);
        kill(foreground_pid(&server, &command));
        assert_eq!(exited(&herdr, &command, Duration::from_secs(5)), 137);

        // After those deaths the subscription still works: a new pane's exit arrives with its
        // status (the pane is gone from herdr at once; only the events carry it).
        let quick = herdr
            .launch(&launch(&["/bin/sh", "-c", "exit 3"], &[], dir.path()))
            .unwrap();
        assert_eq!(exited(&herdr, &quick, Duration::from_secs(5)), 3);
        assert_eq!(herdr.subscriptions(), 1, "one subscription, never refused");
        assert!(herdr.close(&agent).is_ok());
    }

    #[test]
    fn a_restarted_herdr_is_resubscribed_and_fleetd_finds_its_agent_again() {
        let server = HerdrServer::start();
        let dir = tempfile::tempdir().unwrap();
        let claude = claude_in(dir.path());
        let herdr = Herdr::open(&server.socket()).unwrap();
        let agent = herdr.launch(&launch(&[&claude], &[], dir.path())).unwrap();
        eventually("ready", Duration::from_secs(20), || {
            herdr.ready(&agent).unwrap().unwrap().then_some(())
        });

        // A second fleetd (as after a restart) knows the pane only by its id: it finds the agent
        // through the pane's token and prompts it as herdr's agent.
        let again = Herdr::open(&server.socket()).unwrap();
        assert_eq!(again.state(&agent).unwrap(), PaneState::Running);
        assert_eq!(again.ready(&agent).map(Result::unwrap), Some(true));
        again.send_text(&agent, "after restart").unwrap();
        eventually(
            "typed by the second fleetd",
            Duration::from_secs(10),
            || {
                server
                    .text(&agent.0)
                    .contains("got: after restart")
                    .then_some(())
            },
        );

        // herdr itself goes away and comes back: the subscription is reopened.
        let before = herdr.subscriptions();
        let socket = server.socket();
        let server = HerdrServer::start_in(server.stop_keeping_home());
        assert_eq!(server.socket(), socket);
        eventually("resubscribed", Duration::from_secs(15), || {
            (herdr.subscriptions() > before).then_some(())
        });
        let quick = herdr
            .launch(&launch(&["/bin/sh", "-c", "exit 3"], &[], dir.path()))
            .unwrap();
        assert_eq!(exited(&herdr, &quick, Duration::from_secs(5)), 3);
    }

    #[test]
    fn no_secret_reaches_herdrs_log_or_a_panes_screen() {
        let server = HerdrServer::start();
        let dir = tempfile::tempdir().unwrap();
        let claude = claude_in(dir.path());
        let canary = format!("canary-herdr-{}", std::process::id());
        let herdr = Herdr::open(&server.socket()).unwrap();
        let command = herdr
            .launch(&launch(
                &["/bin/sh", "-c", "echo running; sleep 600"],
                &[("API_TOKEN", &canary)],
                dir.path(),
            ))
            .unwrap();
        let agent = herdr
            .launch(&launch(&[&claude], &[("API_TOKEN", &canary)], dir.path()))
            .unwrap();
        eventually("ready", Duration::from_secs(20), || {
            herdr.ready(&agent).unwrap().unwrap().then_some(())
        });
        // The secret is in the processes' environment (where it belongs) …
        let pid = foreground_pid(&server, &command);
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        assert!(String::from_utf8_lossy(&environ).contains(&canary));
        // … and nowhere herdr shows or writes.
        for pane in [&command, &agent] {
            let shown = server.text(&pane.0);
            assert!(!shown.contains(&canary), "on screen: {shown}");
            assert!(
                !shown.contains("FLEETD_RUN="),
                "the script is not shown: {shown}"
            );
        }
        let log = server.log();
        assert!(!log.contains(&canary), "in herdr's log");
    }
}

#[test]
fn an_unknown_protocol_is_refused_at_open() {
    // A stand-in, not herdr: a real herdr cannot be made to speak another protocol.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut line = String::new();
            BufReader::new(&stream).read_line(&mut line).unwrap();
            let _ = stream.write_all(
                b"{\"id\":\"x\",\"result\":{\"type\":\"pong\",\"version\":\"9\",\"protocol\":99}}\n",
            );
        }
    });
    let error = Herdr::open(&socket).unwrap_err();
    assert!(error.to_string().contains("protocol 99"), "{error}");
    let missing = Herdr::open(&dir.path().join("absent.sock")).unwrap_err();
    assert!(missing.to_string().contains("cannot connect"), "{missing}");
}

/// A stand-in herdr (a test double: a real herdr creates the tab it is asked for) that answers
/// `tab.create` with a pane that already existed — the user's, whose shell started long before
/// (it names pid 1) — and records every call. fleetd types nothing into it and does not close
/// it; and a reply line that never ends fills no memory.
#[test]
fn a_herdr_naming_a_pane_it_did_not_just_create_gets_nothing_typed_into_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("herdr.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let calls = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&calls);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut line = String::new();
            if BufReader::new(&stream).read_line(&mut line).is_err() {
                continue;
            }
            let request: serde_json::Value = serde_json::from_str(&line).unwrap();
            let method = request["method"].as_str().unwrap_or_default().to_owned();
            seen.lock().unwrap().push(method.clone());
            let result = match method.as_str() {
                "ping" => json!({"type": "pong", "version": "0.8.2", "protocol": 20}),
                "events.subscribe" => json!({"type": "subscribed"}),
                "workspace.list" => {
                    json!({"workspaces": [{"workspace_id": "w1", "label": "fleetd"}]})
                }
                "tab.create" => json!({"root_pane": {"pane_id": "w1:p1"}}),
                "pane.process_info" => {
                    json!({"process_info": {"shell_pid": 1, "foreground_process_group_id": 1}})
                }
                "pane.list" => json!({"panes": [{"pane_id": "w1:p1"}]}),
                "pane.get" => {
                    // A reply that never ends its line.
                    let chunk = vec![b'x'; 1 << 20];
                    for _ in 0..40 {
                        if stream.write_all(&chunk).is_err() {
                            break;
                        }
                    }
                    continue;
                }
                _ => json!({}),
            };
            let reply = json!({"id": request["id"], "result": result});
            let _ = stream.write_all(format!("{reply}\n").as_bytes());
        }
    });
    let herdr = Herdr::open(&socket).unwrap();
    let error = herdr
        .launch(&launch(&["/bin/sh", "-c", "echo hi"], &[], dir.path()))
        .unwrap_err();
    assert!(
        error.to_string().contains("started before fleetd asked"),
        "{error}"
    );
    let called = calls.lock().unwrap().clone();
    for never in [
        "pane.send_input",
        "agent.prompt",
        "pane.close",
        "agent.start",
    ] {
        assert!(
            !called.iter().any(|c| c == never),
            "{never} was called: {called:?}"
        );
    }
    // An endless reply is cut off, not read into memory.
    let endless = herdr.state(&PaneId("w1:p1".to_owned()));
    assert!(endless.is_err(), "{endless:?}");
}
